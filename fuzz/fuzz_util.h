/* fuzz_util.h - what the readers' fuzz targets share: one input split into
 * several files, a private scratch folder for readers that take a path, and
 * a log of the readers' messages.
 *
 * Each target (fuzz_<reader>.c) defines LLVMFuzzerTestOneInput. Under
 * -DHPDL_FUZZ=ON it links libFuzzer; in every build it also links
 * fuzz_replay.c, whose main() runs saved inputs through the same function
 * (the regression tests of fuzz/regressions/<target>/, CTest label
 * `reliability`). */
#ifndef HPDL_FUZZ_UTIL_H
#define HPDL_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Where one input holds several files (a manifest and the tensors it
 * describes, several token shards), they are separated by this line, so
 * every byte of the input reaches a reader. */
#define FUZZ_SEP "\n<<<hpdl-fuzz-next-file>>>\n"

enum { FUZZ_MAX_PARTS = 8 };

typedef struct {
  const uint8_t *data;
  size_t len;
} FuzzPart;

/* Splits data at FUZZ_SEP into at most FUZZ_MAX_PARTS parts (the last keeps
 * the rest); returns how many (at least 1). */
int fuzz_split(const uint8_t *data, size_t size, FuzzPart *parts);

/* A malloc'ed copy of exactly len bytes (at least one byte allocated), so
 * that AddressSanitizer sees any read past the end of a part. */
uint8_t *fuzz_copy(const uint8_t *data, size_t len);

/* This process's scratch folder (made on first use under $TMPDIR, /dev/shm
 * or /tmp, removed at exit). */
const char *fuzz_dir(void);
/* Writes fuzz_dir()/name; the path goes into out (size 4096). Aborts when
 * the scratch folder cannot be written: that is the harness, not a reader. */
void fuzz_write(const char *name, const void *data, size_t len, char *out);
/* Removes what fuzz_write wrote, so that one input never sees another's. */
void fuzz_clean(void);

/* Records a reader's message. The fuzzer drops it; the replay prints it and
 * checks it against the expected text of a regression input. */
void fuzz_note(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Set by the replay (fuzz_replay.c): 1 prints every note. */
extern int fuzz_verbose;
/* The notes of the current input, NUL-terminated (empty when none). */
const char *fuzz_notes(void);
void fuzz_notes_reset(void);

#endif
