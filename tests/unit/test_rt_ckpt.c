/* test_rt_ckpt.c - checkpoints: CRC-32C and 16-bit floats against known
 * values, safetensors round trips and a file built by hand from the
 * format's description, every validation error, manifests, retention, a
 * failed and a killed writer (never a checkpoint that looks valid), and
 * resharding. */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt.h"
#include "crc32c.h"
#include "half.h"
#include "shard.h"
#include "test_util.h"

static char tmpdir[256];

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }

static void write_bytes(const char *path, const void *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  EXPECT(f != NULL);
  if (!f) return;
  EXPECT(fwrite(buf, 1, n, f) == n);
  fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

#define EXPECT_ERR(msg, needle)                                                        \
  do {                                                                                 \
    if (!strstr((msg), (needle))) {                                                    \
      fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (msg), (needle)); \
      test_failures++;                                                                 \
    }                                                                                  \
  } while (0)

/* ---- checksums and half floats ---- */

static void test_crc32c(void) {
  EXPECT(crc32c_update(0, "123456789", 9) == 0xE3069283u); /* the check value (RFC 3720 B.4) */
  EXPECT(crc32c_update(0, "", 0) == 0);
  unsigned char zeros[32] = {0};
  EXPECT(crc32c_update(0, zeros, 32) == 0x8A9136AAu); /* RFC 3720 B.4: 32 bytes of zeros */
  unsigned char ones[32];
  memset(ones, 0xff, sizeof ones);
  EXPECT(crc32c_update(0, ones, 32) == 0x62A8AB43u); /* RFC 3720 B.4: 32 bytes of 0xff */
  /* In pieces, at every split and misalignment: the same value. */
  unsigned char buf[100];
  for (int i = 0; i < 100; i++) buf[i] = (unsigned char)(i * 37 + 11);
  uint32_t whole = crc32c_update(0, buf, 100);
  for (int cut = 0; cut <= 100; cut += 7) EXPECT(crc32c_update(crc32c_update(0, buf, (size_t)cut), buf + cut, (size_t)(100 - cut)) == whole);
  EXPECT(crc32c_update(0, buf + 3, 50) == crc32c_update(crc32c_update(0, buf + 3, 13), buf + 16, 37));
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float ffrom(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_half(void) {
  EXPECT(half_from_f32(1.0f) == 0x3C00);
  EXPECT(half_from_f32(-2.0f) == 0xC000);
  EXPECT(half_from_f32(65504.0f) == 0x7BFF);      /* the largest half */
  EXPECT(half_from_f32(65520.0f) == 0x7C00);      /* halfway to 65536: rounds to even = infinity */
  EXPECT(half_from_f32(65519.0f) == 0x7BFF);
  EXPECT(half_from_f32(0x1p-24f) == 0x0001);      /* the smallest subnormal */
  EXPECT(half_from_f32(0x1p-25f) == 0x0000);      /* halfway: even is 0 */
  EXPECT(half_from_f32(0x1.8p-25f) == 0x0001);
  EXPECT(half_from_f32(0.1f) == 0x2E66);
  EXPECT(half_from_f32(1.0f + 0x1p-11f) == 0x3C00); /* tie to even */
  EXPECT(half_from_f32(1.0f + 0x3p-11f) == 0x3C02); /* tie to even, upwards */
  EXPECT((half_from_f32(ffrom(0x7fc00000u)) & 0x7e00) == 0x7e00); /* NaN stays NaN */
  EXPECT(half_to_f32(0x3555) == 0x1.554p-2f);
  /* Every finite half converts to float and back to itself. */
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaNs */
    EXPECT(half_from_f32(half_to_f32((uint16_t)h)) == h);
  }
  EXPECT(half_bf16_from_f32(1.0f) == 0x3F80);
  EXPECT(half_bf16_from_f32(ffrom(0x3F808000u)) == 0x3F80); /* tie: even */
  EXPECT(half_bf16_from_f32(ffrom(0x3F818000u)) == 0x3F82); /* tie: even, upwards */
  EXPECT(half_bf16_from_f32(ffrom(0x3F808001u)) == 0x3F81);
  EXPECT(fbits(half_bf16_to_f32(0xC049)) == 0xC0490000u);
}

/* ---- safetensors ---- */

static void test_roundtrip(void) {
  double d[3] = {1.5, -2.25, 3e100};
  float f[2][3] = {{1, 2, 3}, {4, 5, 6}};
  uint16_t h[4] = {0x3C00, 0xC000, 0x7BFF, 0x0001};
  uint16_t bf[2] = {0x3F80, 0xC049};
  int32_t i32[1] = {-7};
  uint8_t u8[5] = {1, 2, 3, 4, 5};
  float scalar = 42.0f;
  CkptTensor t[] = {
      {"u8", CKPT_U8, 1, {5}, u8},      {"f32", CKPT_F32, 2, {2, 3}, f},       {"f16", CKPT_F16, 1, {4}, h},
      {"bf16", CKPT_BF16, 1, {2}, bf},  {"f64", CKPT_F64, 1, {3}, d},          {"i32", CKPT_I32, 1, {1}, i32},
      {"scalar", CKPT_F32, 0, {0}, &scalar}, {"empty", CKPT_F32, 2, {0, 4}, NULL},
  };
  int n = sizeof t / sizeof t[0];
  char p[512];
  path_in(p, sizeof p, "rt.safetensors");
  json_t *meta = json_pack("{s:s}", "format", "pt");
  uint32_t crc[8], hcrc = 0;
  RtErr e;
  EXPECT(ckpt_st_write(p, t, n, meta, crc, &hcrc, &e) == 0);
  json_decref(meta);
  EXPECT(crc[1] == crc32c_update(0, f, sizeof f));
  size_t len;
  unsigned char *raw = read_bytes(p, &len);
  uint64_t hl;
  memcpy(&hl, raw, 8);
  EXPECT(hl % 8 == 0); /* the byte buffer starts 8-aligned */
  EXPECT(raw[8] == '{');
  EXPECT(len == 8 + hl + 24 + 24 + 4 + 8 + 4 + 4 + 5);
  EXPECT(hcrc == crc32c_update(0, raw, 8 + hl));
  free(raw);
  CkptFile *cf = ckpt_st_open(p, &e);
  EXPECT(cf != NULL);
  if (!cf) {
    fprintf(stderr, "%s\n", e.msg);
    return;
  }
  EXPECT(ckpt_st_count(cf) == n);
  const CkptTensor *x = ckpt_st_find(cf, "f32");
  EXPECT(x && x->rank == 2 && x->shape[0] == 2 && x->shape[1] == 3 && !memcmp(x->data, f, sizeof f));
  x = ckpt_st_find(cf, "f64");
  EXPECT(x && !memcmp(x->data, d, sizeof d));
  EXPECT(((uintptr_t)x->data - (uintptr_t)ckpt_st_find(cf, "u8")->data) % 1 == 0);
  EXPECT(((uintptr_t)x->data) % 8 == 0); /* widest first: naturally aligned */
  x = ckpt_st_find(cf, "scalar");
  EXPECT(x && x->rank == 0 && ckpt_numel(x) == 1 && *(const float *)x->data == 42.0f);
  x = ckpt_st_find(cf, "empty");
  EXPECT(x && ckpt_numel(x) == 0);
  float conv[4];
  EXPECT(ckpt_st_read_f32(ckpt_st_find(cf, "f16"), conv, &e) == 0);
  EXPECT(conv[0] == 1.0f && conv[1] == -2.0f && conv[2] == 65504.0f && conv[3] == 0x1p-24f);
  EXPECT(ckpt_st_read_f32(ckpt_st_find(cf, "bf16"), conv, &e) == 0);
  EXPECT(conv[0] == 1.0f && conv[1] == ffrom(0xC0490000u));
  EXPECT(ckpt_st_read_f32(ckpt_st_find(cf, "i32"), conv, &e) < 0);
  EXPECT(!strcmp(json_string_value(json_object_get(ckpt_st_meta(cf), "format")), "pt"));
  ckpt_st_close(cf);
  /* duplicate names are refused */
  CkptTensor dup[2] = {{"a", CKPT_F32, 0, {0}, &scalar}, {"a", CKPT_F32, 0, {0}, &scalar}};
  EXPECT(ckpt_st_write(p, dup, 2, NULL, NULL, NULL, &e) < 0);
  EXPECT_ERR(e.msg, "two tensors are named a");
}

/* A file written byte by byte from the format's description (not by our
 * writer) reads back: the reader follows the format, not our habits. */
static void test_handmade_file(void) {
  const char *hdr = "{\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                    "\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}";
  size_t hl = strlen(hdr);
  unsigned char buf[256];
  uint64_t n = hl;
  memcpy(buf, &n, 8);
  memcpy(buf + 8, hdr, hl);
  double a = -0.5;
  int32_t b[2] = {7, -9};
  memcpy(buf + 8 + hl, &a, 8);
  memcpy(buf + 8 + hl + 8, b, 8);
  char p[512];
  path_in(p, sizeof p, "hand.safetensors");
  write_bytes(p, buf, 8 + hl + 16);
  RtErr e;
  CkptFile *cf = ckpt_st_open(p, &e);
  EXPECT(cf != NULL);
  if (!cf) {
    fprintf(stderr, "%s\n", e.msg);
    return;
  }
  const CkptTensor *ta = ckpt_st_find(cf, "a"), *tb = ckpt_st_find(cf, "b");
  double got;
  int32_t gb[2];
  memcpy(&got, ta->data, 8);
  memcpy(gb, tb->data, 8);
  EXPECT(got == -0.5 && gb[0] == 7 && gb[1] == -9 && tb->dtype == CKPT_I32);
  ckpt_st_close(cf);
}

/* Writes `hdr` as a safetensors header followed by `data` bytes and
 * expects ckpt_st_open to fail with `needle` in the message. */
static void bad_file(const char *name, const char *hdr, size_t data, const char *needle) {
  unsigned char buf[1024];
  memset(buf, 0, sizeof buf);
  uint64_t n = strlen(hdr);
  memcpy(buf, &n, 8);
  memcpy(buf + 8, hdr, n);
  char p[512];
  path_in(p, sizeof p, name);
  write_bytes(p, buf, 8 + n + data);
  RtErr e;
  CkptFile *cf = ckpt_st_open(p, &e);
  EXPECT(cf == NULL);
  if (cf) ckpt_st_close(cf);
  else {
    EXPECT_ERR(e.msg, needle);
    EXPECT_ERR(e.msg, name); /* every message names the file */
  }
}

static void test_bad_files(void) {
  char p[512];
  path_in(p, sizeof p, "short.safetensors");
  write_bytes(p, "abc", 3);
  RtErr e;
  EXPECT(ckpt_st_open(p, &e) == NULL);
  EXPECT_ERR(e.msg, "truncated");
  /* header length past the end of the file */
  unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
  path_in(p, sizeof p, "hlen.safetensors");
  write_bytes(p, big, sizeof big);
  EXPECT(ckpt_st_open(p, &e) == NULL);
  EXPECT_ERR(e.msg, "the header length at byte 0 is 65535 bytes");
  bad_file("json.safetensors", "{\"a\": [", 0, "not a JSON object");
  bad_file("dtype.safetensors", "{\"a\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype F7");
  bad_file("size.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "needs 8");
  bad_file("trunc.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 10,
           "truncated: tensor a ends at byte");
  bad_file("overlap.safetensors",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
           "overlaps");
  bad_file("hole.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "leaves a hole");
  bad_file("tail.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12, "8 bytes after the last tensor");
  bad_file("entry.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0, "needs dtype, shape and data_offsets");
  path_in(p, sizeof p, "absent.safetensors");
  EXPECT(ckpt_st_open(p, &e) == NULL);
  EXPECT_ERR(e.msg, "No such file");
}

/* ---- checkpoints ---- */

static int count_files(const char *dir, const char *needle) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *de;
  while (d && (de = readdir(d)))
    if (strstr(de->d_name, needle)) n++;
  if (d) closedir(d);
  return n;
}

static void save_step(const char *dir, int64_t step, int keep, float base) {
  float w[6], b[2];
  for (int i = 0; i < 6; i++) w[i] = base + (float)i;
  b[0] = base;
  b[1] = -base;
  CkptTensor t[2] = {{"w", CKPT_F32, 2, {2, 3}, w}, {"b", CKPT_F32, 1, {2}, b}};
  json_t *info = json_pack("{s:I}", "step", (json_int_t)step);
  RtErr e;
  int rc = ckpt_save(dir, step, t, 2, info, keep, NULL, &e);
  if (rc) fprintf(stderr, "%s\n", e.msg);
  EXPECT(rc == 0);
  json_decref(info);
}

static void test_save_load_keep(void) {
  char dir[512];
  path_in(dir, sizeof dir, "ck");
  RtErr e;
  int64_t step;
  char mp[4096];
  EXPECT(ckpt_latest(dir, &step, mp, &e) == 0); /* no folder yet: none */
  for (int s = 1; s <= 5; s++) save_step(dir, s * 10, 2, (float)s);
  EXPECT(count_files(dir, ".json") == 2 && count_files(dir, ".safetensors") == 2);
  EXPECT(ckpt_latest(dir, &step, mp, &e) == 1 && step == 50);
  Ckpt *c = ckpt_load(dir, &e); /* a folder means its latest */
  EXPECT(c != NULL);
  if (!c) {
    fprintf(stderr, "%s\n", e.msg);
    return;
  }
  EXPECT(ckpt_step(c) == 50);
  EXPECT(json_integer_value(json_object_get(ckpt_info(c), "step")) == 50);
  const CkptTensor *w = ckpt_st_find(ckpt_file(c), "w");
  EXPECT(w && ((const float *)w->data)[5] == 10.0f);
  ckpt_close(c);
  /* the manifest records one CRC per tensor */
  char man[4200];
  snprintf(man, sizeof man, "%s/step-00000050.json", dir);
  json_error_t je;
  json_t *m = json_load_file(man, 0, &je);
  EXPECT(m && !strcmp(json_string_value(json_object_get(m, "checksum")), "crc32c"));
  float w50[6] = {5, 6, 7, 8, 9, 10};
  char hex[16];
  snprintf(hex, sizeof hex, "%08x", crc32c_update(0, w50, sizeof w50));
  EXPECT(!strcmp(json_string_value(json_object_get(json_object_get(json_object_get(m, "tensors"), "w"), "crc32c")), hex));
  json_decref(m);
}

static void corrupt_byte(const char *path, long at) {
  FILE *f = fopen(path, "r+b");
  EXPECT(f != NULL);
  if (!f) return;
  fseek(f, at, at < 0 ? SEEK_END : SEEK_SET);
  int c = fgetc(f);
  fseek(f, -1, SEEK_CUR);
  fputc(c ^ 0x40, f);
  fclose(f);
}

static void test_corruption_and_truncation(void) {
  char dir[512], t[4200], m[4200];
  path_in(dir, sizeof dir, "bad");
  save_step(dir, 7, 0, 1.0f);
  snprintf(t, sizeof t, "%s/step-00000007.safetensors", dir);
  snprintf(m, sizeof m, "%s/step-00000007.json", dir);
  RtErr e;
  /* a flipped bit in a tensor's data */
  corrupt_byte(t, -3);
  Ckpt *c = ckpt_load(m, &e);
  EXPECT(c == NULL);
  EXPECT_ERR(e.msg, "corrupted: tensor");
  EXPECT_ERR(e.msg, "CRC-32C");
  /* a flipped bit in the header */
  save_step(dir, 7, 0, 1.0f);
  corrupt_byte(t, 40);
  EXPECT(ckpt_load(m, &e) == NULL);
  EXPECT(strstr(e.msg, "corrupted") || strstr(e.msg, "not a JSON") || strstr(e.msg, "dtype"));
  /* truncation */
  save_step(dir, 7, 0, 1.0f);
  EXPECT(truncate(t, 100) == 0);
  EXPECT(ckpt_load(m, &e) == NULL);
  EXPECT_ERR(e.msg, "truncated: the file has 100 bytes");
  /* the tensor file gone */
  unlink(t);
  EXPECT(ckpt_load(m, &e) == NULL);
  EXPECT_ERR(e.msg, "cannot be read");
  /* a manifest that is not JSON */
  write_bytes(m, "{\"format\": ", 11);
  EXPECT(ckpt_load(m, &e) == NULL);
  EXPECT_ERR(e.msg, "not valid JSON");
}

/* A write that fails half-way (a full disk) and a writer killed half-way
 * (a crash): the latest checkpoint stays the last complete one. */
static void test_failed_and_killed_writers(void) {
  char dir[512];
  path_in(dir, sizeof dir, "fault");
  save_step(dir, 1, 0, 1.0f);
  RtErr e;
  int64_t step;
  char mp[4096];
  /* 1: the write fails after 50 bytes */
  setenv("HPDL_FAULT", "ckpt-fail-after=50", 1);
  float w[6] = {0};
  CkptTensor t[1] = {{"w", CKPT_F32, 2, {2, 3}, w}};
  EXPECT(ckpt_save(dir, 2, t, 1, NULL, 0, NULL, &e) < 0);
  EXPECT_ERR(e.msg, "No space left");
  unsetenv("HPDL_FAULT");
  EXPECT(ckpt_latest(dir, &step, mp, &e) == 1 && step == 1);
  EXPECT(count_files(dir, ".tmp.") == 0); /* the temporary is removed */
  EXPECT(count_files(dir, "step-00000002") == 0);
  /* 2: the writer is killed half-way through the tensor file */
  for (int where = 0; where < 2; where++) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("HPDL_FAULT", where == 0 ? "ckpt-kill-after=60" : "ckpt-kill-before-manifest", 1);
      save_step(dir, 3, 0, 3.0f);
      _exit(0); /* not reached */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    EXPECT(ckpt_latest(dir, &step, mp, &e) == 1 && step == 1);
    Ckpt *c = ckpt_load(dir, &e);
    EXPECT(c && ckpt_step(c) == 1);
    ckpt_close(c);
  }
  EXPECT(count_files(dir, ".tmp.") == 1);                     /* left by the first killed writer */
  char orphan[600];
  snprintf(orphan, sizeof orphan, "%s/step-00000003.safetensors", dir);
  struct stat st;
  EXPECT(stat(orphan, &st) == 0); /* the second's, without a manifest */
  /* The next save cleans up after them. */
  save_step(dir, 4, 0, 4.0f);
  EXPECT(count_files(dir, ".tmp.") == 0);
  EXPECT(count_files(dir, "step-00000003") == 0);
  EXPECT(ckpt_latest(dir, &step, mp, &e) == 1 && step == 4);
}

/* ---- resharding ---- */

static ShardSplit once(int axis, int parts, int index) {
  ShardSplit s = {axis, parts, index, -1, 1, 0};
  return s;
}

static void test_resharding(void) {
  int64_t dims[2] = {4, 6};
  float logical[24], back[24], piece[24];
  for (int i = 0; i < 24; i++) logical[i] = (float)i;
  char why[160];
  int64_t local[2];
  /* axis 1 in 3: piece 1 holds columns 2, 3 of every row */
  ShardSplit s = once(1, 3, 1);
  EXPECT(shard_dims(2, dims, &s, local, why, sizeof why) == 0 && local[0] == 4 && local[1] == 2);
  shard_extract(logical, 4, 2, dims, &s, piece);
  float want[8] = {2, 3, 8, 9, 14, 15, 20, 21};
  EXPECT(!memcmp(piece, want, sizeof want));
  /* every axis, every split: the pieces put back give the tensor */
  for (int axis = 0; axis < 2; axis++)
    for (int parts = 1; parts <= 6; parts++) {
      if (dims[axis] % parts) {
        ShardSplit q = once(axis, parts, 0);
        EXPECT(shard_dims(2, dims, &q, local, why, sizeof why) < 0);
        EXPECT_ERR(why, "does not divide");
        continue;
      }
      memset(back, 0, sizeof back);
      for (int r = 0; r < parts; r++) {
        ShardSplit q = once(axis, parts, r);
        shard_extract(logical, 4, 2, dims, &q, piece);
        shard_insert(back, 4, 2, dims, &q, piece);
      }
      EXPECT(!memcmp(back, logical, sizeof logical));
    }
  /* saved at tp = 2 (axis 0), resumed at tp = 3 (axis 1): through the logical tensor */
  float a0[12], a1[12], full[24], b2[8];
  ShardSplit s0 = once(0, 2, 0), s1 = once(0, 2, 1), s2 = once(1, 3, 2);
  shard_extract(logical, 4, 2, dims, &s0, a0);
  shard_extract(logical, 4, 2, dims, &s1, a1);
  shard_insert(full, 4, 2, dims, &s0, a0);
  shard_insert(full, 4, 2, dims, &s1, a1);
  shard_extract(full, 4, 2, dims, &s2, b2);
  float want2[8] = {4, 5, 10, 11, 16, 17, 22, 23};
  EXPECT(!memcmp(b2, want2, sizeof want2));
  /* twice: rows in 2 (the experts over ep), then columns in 3 (each
   * expert's block over tp): piece (1, 2) holds rows 2-3, columns 4-5 */
  ShardSplit t = {0, 2, 1, 1, 3, 2};
  EXPECT(shard_dims(2, dims, &t, local, why, sizeof why) == 0 && local[0] == 2 && local[1] == 2);
  shard_extract(logical, 4, 2, dims, &t, piece);
  float want3[4] = {16, 17, 22, 23};
  EXPECT(!memcmp(piece, want3, sizeof want3));
  memset(back, 0, sizeof back);
  for (int r = 0; r < 6; r++) {
    ShardSplit q = {0, 2, r / 3, 1, 3, r % 3};
    shard_extract(logical, 4, 2, dims, &q, piece);
    shard_insert(back, 4, 2, dims, &q, piece);
  }
  EXPECT(!memcmp(back, logical, sizeof logical));
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hpdl_test_rt_ckpt.XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_crc32c();
  test_half();
  test_roundtrip();
  test_handmade_file();
  test_bad_files();
  test_save_load_keep();
  test_corruption_and_truncation();
  test_failed_and_killed_writers();
  test_resharding();
  if (!test_failures) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  TEST_DONE();
}
