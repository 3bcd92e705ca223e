/* fuzz_ckpt.c - libFuzzer target for the checkpoint readers (runtime/ckpt.c).
 *
 * The input is a checkpoint: its manifest (step-NNNNNNNN.json), FUZZ_SEP,
 * then its tensor file (safetensors); an input without FUZZ_SEP is a tensor
 * file alone. Three readers run over it:
 *   1. ckpt_st_open_mem on the tensor bytes, then every tensor is read as
 *      the runtime reads it (CRC-32C, conversion to fp32);
 *   2. ckpt_load on the two files written to a scratch folder;
 *   3. ckpt_load again with the manifest's file size and checksums set to
 *      the tensor file's, so that the fuzzer gets past them to the checks
 *      behind (a fix-up done here with jansson, not by the reader).
 * Any message is fine; a crash, a sanitizer report, a leak or a hang is a
 * bug. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "crc32c.h"
#include "fuzz_util.h"

/* What the runtime does with every tensor of a file it loads. */
static void read_tensors(const CkptFile *f) {
  for (int i = 0; i < ckpt_st_count(f); i++) {
    const CkptTensor *t = ckpt_st_tensor(f, i);
    if (ckpt_st_find(f, t->name) != t) abort(); /* names are unique */
    int64_t n = ckpt_numel(t);
    (void)crc32c_update(0, t->data, (size_t)n * (size_t)ckpt_dtype_size(t->dtype));
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    if (!out) abort();
    RtErr e;
    if (ckpt_st_read_f32(t, out, &e) < 0) fuzz_note("read_f32: %s", e.msg);
    free(out);
  }
  const json_t *meta = ckpt_st_meta(f);
  const char *key;
  json_t *val;
  if (meta) json_object_foreach((json_t *)meta, key, val) (void)json_string_value(val);
}

/* The name the manifest gives the tensor file when it is a plain file name
 * in the scratch folder; else a fixed one (the reader then reports the
 * missing file). */
static const char *tensor_name(const json_t *man, char *buf, size_t n) {
  const char *tf = json_string_value(json_object_get(man, "tensors_file"));
  int plain = tf && *tf && strlen(tf) < 200 && strcmp(tf, ".") && strcmp(tf, "..") && strcmp(tf, "step-00000001.json");
  for (const char *p = tf; plain && *p; p++)
    plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-';
  snprintf(buf, n, "%s", plain ? tf : "step-00000001.safetensors");
  return buf;
}

static void load(const char *mpath) {
  RtErr e;
  Ckpt *c = ckpt_load(mpath, &e);
  if (!c) {
    fuzz_note("ckpt_load: %s", e.msg);
    return;
  }
  fuzz_note("ckpt_load: step %" PRId64 ", %d tensors", ckpt_step(c), ckpt_st_count(ckpt_file(c)));
  read_tensors(ckpt_file(c));
  json_t *info = json_deep_copy(ckpt_info(c));
  json_decref(info);
  ckpt_close(c);
}

/* The manifest with file_bytes, header_crc32c and each listed tensor's
 * crc32c made to match f; NULL when nothing changes. */
static char *fixed_manifest(const json_t *man, const CkptFile *f) {
  json_t *m = json_deep_copy(man);
  if (!m) return NULL;
  char hex[16];
  json_object_set_new(m, "file_bytes", json_integer(ckpt_st_file_bytes(f)));
  snprintf(hex, sizeof hex, "%08" PRIx32, ckpt_st_header_crc(f));
  json_object_set_new(m, "header_crc32c", json_string(hex));
  json_t *tens = json_object_get(m, "tensors");
  const char *key;
  json_t *val;
  if (json_is_object(tens)) json_object_foreach(tens, key, val) {
      const CkptTensor *t = ckpt_st_find(f, key);
      if (!t || !json_is_object(val)) continue;
      uint32_t crc = crc32c_update(0, t->data, (size_t)ckpt_numel(t) * (size_t)ckpt_dtype_size(t->dtype));
      snprintf(hex, sizeof hex, "%08" PRIx32, crc);
      json_object_set_new(val, "crc32c", json_string(hex));
    }
  char *text = json_equal(m, (json_t *)man) ? NULL : json_dumps(m, JSON_COMPACT);
  json_decref(m);
  return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FuzzPart part[FUZZ_MAX_PARTS];
  int np = fuzz_split(data, size, part);
  const FuzzPart *manifest = np > 1 ? &part[0] : NULL, *tensors = np > 1 ? &part[1] : &part[0];

  RtErr e;
  uint8_t *bytes = fuzz_copy(tensors->data, tensors->len);
  CkptFile *f = ckpt_st_open_mem("fuzz.safetensors", bytes, tensors->len, &e);
  if (f) {
    fuzz_note("ckpt_st_open_mem: %d tensors", ckpt_st_count(f));
    read_tensors(f);
  } else {
    fuzz_note("ckpt_st_open_mem: %s", e.msg);
  }

  if (manifest) {
    json_t *man = json_loadb((const char *)manifest->data, manifest->len, 0, NULL);
    char tname[256], mpath[4096], tpath[4096];
    tensor_name(man, tname, sizeof tname);
    fuzz_write("step-00000001.json", manifest->data, manifest->len, mpath);
    fuzz_write(tname, tensors->data, tensors->len, tpath);
    load(mpath);
    char *fixed = f && json_is_object(man) ? fixed_manifest(man, f) : NULL;
    if (fixed) {
      fuzz_write("step-00000001.json", fixed, strlen(fixed), mpath);
      load(mpath);
      free(fixed);
    }
    json_decref(man);
    fuzz_clean();
  }
  ckpt_st_close(f);
  free(bytes);
  return 0;
}
