/* fuzz_artifact.c - libFuzzer target for the artifact's readers: the
 * manifest (runtime/artifact.c) and the chunk files (core/program_ir.c).
 *
 * The input is an artifact: DIR/manifest.json, then FUZZ_SEP and each
 * chunk file (stageS.hir). The manifest is written to a scratch folder
 * holding an empty program.so (what compiled manifests name) and read with
 * artifact_load; every parameter's size and per-layer names are then taken
 * as the runtime takes them, and the files the manifest lists are checked
 * (artifact_check_files, with and without --allow-native). Each chunk is
 * decoded from memory, and when its header's payload length or CRC-32C
 * does not match, decoded a second time with them set right, so that the
 * fuzzer gets past the checksum to the records behind it. Any message is
 * fine; a crash, a sanitizer report, a leak or a hang is a bug. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "artifact.h"
#include "crc32c.h"
#include "fuzz_util.h"
#include "program_ir.h"

enum { HEADER_BYTES = 28 }; /* magic, version, flags, payload length, CRC (program_ir.h) */

/* What the runtime computes from a manifest (train.c, data.c) must stay
 * within the bounds artifact.h promises: products in double, so that the
 * check itself cannot overflow (exact below 2^53). */
static void use_artifact(const Artifact *a) {
  char name[256];
  double ranks = (double)a->layout.dp * a->layout.tp * a->layout.pp * a->layout.cp;
  double tokens = (double)a->layout.dp * (double)a->micro_batch * (double)a->num_micro_batches * (double)a->seq_len;
  if (ranks != a->world_size || tokens > (double)ART_MAX_TOKENS) abort();
  for (int i = 0; i < a->nparams; i++) {
    const ArtParam *p = &a->params[i];
    double numel = 1;
    for (int d = 0; d < p->rank; d++) numel *= (double)p->shape[d];
    if (numel * (double)p->count > (double)ART_MAX_ELEMENTS) abort();
    if (artifact_param_numel(p) != (int64_t)numel) abort();
    for (int64_t l = 0; l < p->count && l < 4; l++) (void)artifact_param_name(p, l, name, sizeof name);
    for (int64_t l = 0; l < p->count; l++)
      if (p->stages[l] < 0 || p->stages[l] >= a->layout.pp) abort(); /* the reader promised stages 0 .. pp-1 */
  }
}

static void decode(const uint8_t *data, size_t len, int chunk) {
  char err[512];
  Arena *arena = arena_new();
  uint8_t *bytes = fuzz_copy(data, len);
  ProgramChunk *c = program_ir_decode(arena, bytes, len, err, sizeof err);
  if (c) fuzz_note("chunk %d: %d graphs, %d params", chunk, c->m->ngraphs, c->m->nparams);
  else fuzz_note("chunk %d: %s", chunk, err);
  if (!c && len >= HEADER_BYTES && !memcmp(bytes, PROGRAM_IR_MAGIC, 8)) {
    uint64_t payload = len - HEADER_BYTES, had_payload;
    uint32_t crc = crc32c_update(0, bytes + HEADER_BYTES, payload), had_crc;
    memcpy(&had_payload, bytes + 16, 8);
    memcpy(&had_crc, bytes + 24, 4);
    if (had_payload != payload || had_crc != crc) {
      memcpy(bytes + 16, &payload, 8);
      memcpy(bytes + 24, &crc, 4);
      c = program_ir_decode(arena, bytes, len, err, sizeof err);
      if (c) fuzz_note("chunk %d with its checksum set: %d graphs, %d params", chunk, c->m->ngraphs, c->m->nparams);
      else fuzz_note("chunk %d with its checksum set: %s", chunk, err);
    }
  }
  free(bytes);
  arena_free(arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  char path[4096];
  if (!ready) { /* what a compiled manifest names and artifact_load checks exists */
    fuzz_write("program.so", "", 0, path);
    ready = 1;
  }
  FuzzPart part[FUZZ_MAX_PARTS];
  int np = fuzz_split(data, size, part);

  fuzz_write("manifest.json", part[0].data, part[0].len, path);
  RtErr e;
  Artifact *a = artifact_load(fuzz_dir(), &e);
  if (a) {
    fuzz_note("artifact_load: world size %d, %d params", a->world_size, a->nparams);
    use_artifact(a);
    for (int allow_native = 0; allow_native < 2; allow_native++)
      if (artifact_check_files(a, allow_native, &e) < 0) fuzz_note("artifact_check_files(%d): %s", allow_native, e.msg);
    artifact_free(a);
  } else {
    fuzz_note("artifact_load: %s", e.msg);
  }
  for (int i = 1; i < np; i++) decode(part[i].data, part[i].len, i - 1);
  return 0;
}
