/* fuzz_util.c - splitting an input, the scratch folder, the notes (see
 * fuzz_util.h). */
#include "fuzz_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fuzz_verbose;

int fuzz_split(const uint8_t *data, size_t size, FuzzPart *parts) {
  static const char sep[] = FUZZ_SEP;
  const size_t seplen = sizeof sep - 1;
  int n = 0;
  size_t at = 0;
  while (n < FUZZ_MAX_PARTS - 1) {
    size_t next = at;
    const uint8_t *hit = NULL;
    /* memmem is a GNU extension; the inputs are small */
    while (next + seplen <= size && !hit) {
      if (data[next] == (uint8_t)sep[0] && !memcmp(data + next, sep, seplen)) hit = data + next;
      else next++;
    }
    if (!hit) break;
    parts[n++] = (FuzzPart){data + at, next - at};
    at = next + seplen;
  }
  parts[n++] = (FuzzPart){data + at, size - at};
  return n;
}

uint8_t *fuzz_copy(const uint8_t *data, size_t len) {
  uint8_t *p = malloc(len ? len : 1);
  if (!p) abort();
  if (len) memcpy(p, data, len);
  return p;
}

/* ---- the scratch folder ---- */

static char scratch[4096];
static char written[64][256];
static int nwritten;

static void remove_scratch(void) {
  fuzz_clean();
  if (scratch[0]) rmdir(scratch);
}

const char *fuzz_dir(void) {
  if (scratch[0]) return scratch;
  const char *bases[] = {getenv("TMPDIR"), "/dev/shm", "/tmp"};
  for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
    if (!bases[i] || !*bases[i] || access(bases[i], W_OK) != 0) continue;
    snprintf(scratch, sizeof scratch, "%s/hpdl-fuzz-XXXXXX", bases[i]);
    if (mkdtemp(scratch)) {
      atexit(remove_scratch);
      return scratch;
    }
  }
  fprintf(stderr, "fuzz: cannot make a scratch folder\n");
  abort();
}

void fuzz_write(const char *name, const void *data, size_t len, char *out) {
  snprintf(out, 4096, "%s/%s", fuzz_dir(), name);
  FILE *f = fopen(out, "wb");
  if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
    fprintf(stderr, "fuzz: cannot write %s\n", out);
    abort();
  }
  for (int i = 0; i < nwritten; i++)
    if (!strcmp(written[i], name)) return;
  if (nwritten == (int)(sizeof written / sizeof written[0]) || strlen(name) >= sizeof written[0]) abort();
  snprintf(written[nwritten++], sizeof written[0], "%s", name);
}

void fuzz_clean(void) {
  char p[sizeof scratch + sizeof written[0] + 1];
  for (int i = 0; i < nwritten; i++) {
    snprintf(p, sizeof p, "%s/%.255s", scratch, written[i]);
    unlink(p);
  }
  nwritten = 0;
}

/* ---- notes ---- */

static char notes[16384];
static size_t notes_len;

void fuzz_note(const char *fmt, ...) {
  if (!fuzz_verbose) return; /* fuzzing: the messages cost time and tell nothing */
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(notes + notes_len, sizeof notes - notes_len, fmt, ap);
  va_end(ap);
  if (w > 0) notes_len += (size_t)w < sizeof notes - notes_len ? (size_t)w : sizeof notes - notes_len - 1;
  if (notes_len + 1 < sizeof notes) notes[notes_len++] = '\n';
  notes[notes_len] = 0;
}

const char *fuzz_notes(void) { return notes; }

void fuzz_notes_reset(void) {
  notes_len = 0;
  notes[0] = 0;
}
