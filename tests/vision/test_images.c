/* test_images.c - image files and the loader over them (runtime/data.c):
 * the header and its errors (file and byte named: magic, version,
 * dimensions, truncation naming the first missing image, extra bytes,
 * labels), the shape rule against a model's input, the format chosen by
 * the magic, pixels as p / 255 - 0.5, the data-parallel split (a step reads
 * the same images at dp 1 and 2), prefetching, seeking and resuming, and
 * the synthetic images. CTest: vision.loader. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data.h"
#include "test_util.h"

static char tmpdir[256];

#define EXPECT_ERR(msg, needle)                                                                     \
  do {                                                                                              \
    if (!strstr((msg), (needle))) {                                                                 \
      fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (msg), (needle)); \
      test_failures++;                                                                              \
    }                                                                                               \
  } while (0)

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }

/* Image i of file f: label (f * 100 + i) % K, pixel k = (f * 100 + i + k) % 256,
 * so a batch tells which images it holds. */
static unsigned char *numbered(int f, int n, int c, int h, int w, int K) {
  int rec = 1 + c * h * w;
  unsigned char *r = malloc((size_t)(n * rec));
  for (int i = 0; i < n; i++) {
    r[i * rec] = (unsigned char)((f * 100 + i) % K);
    for (int k = 0; k < c * h * w; k++) r[i * rec + 1 + k] = (unsigned char)((f * 100 + i + k) % 256);
  }
  return r;
}

static void write_numbered(const char *name, int f, int n, int c, int h, int w, int K) {
  char p[512];
  path_in(p, sizeof p, name);
  unsigned char *r = numbered(f, n, c, h, w, K);
  RtErr e;
  EXPECT(data_images_write(p, n, c, h, w, K, r, &e) == 0);
  free(r);
}

/* A file of raw bytes: a header of 16 int32 and `body` bytes after it
 * (from `records`, or zeros). */
static void write_body(const char *name, const int32_t *hdr, const unsigned char *records, size_t body) {
  char p[512];
  path_in(p, sizeof p, name);
  unsigned char *buf = calloc(1, 64 + body);
  for (int i = 0; i < 16; i++)
    for (int b = 0; b < 4; b++) buf[4 * i + b] = (unsigned char)((uint32_t)hdr[i] >> (8 * b));
  if (records) memcpy(buf + 64, records, body);
  FILE *f = fopen(p, "wb");
  fwrite(buf, 1, 64 + body, f);
  fclose(f);
  free(buf);
}

static void write_raw(const char *name, const int32_t *hdr, size_t body) { write_body(name, hdr, NULL, body); }

static void expect_open_error(const char *name, const char *needle) {
  char p[512];
  path_in(p, sizeof p, name);
  DataImages s;
  RtErr e;
  EXPECT(data_images_open(&s, p, &e) < 0);
  EXPECT_ERR(e.msg, needle);
  EXPECT_ERR(e.msg, name);
}

static void test_header(void) {
  write_numbered("ok.img", 0, 5, 3, 2, 2, 10);
  char p[512];
  path_in(p, sizeof p, "ok.img");
  struct stat st;
  EXPECT(stat(p, &st) == 0 && st.st_size == 64 + 5 * 13);
  DataImages s;
  RtErr e;
  EXPECT(data_images_open(&s, p, &e) == 0);
  EXPECT(s.version == 1 && s.count == 5 && s.channels == 3 && s.height == 2 && s.width == 2 && s.classes == 10 && s.record_bytes == 13);
  EXPECT(data_images_record(&s, 3)[0] == 3 && data_images_record(&s, 3)[1 + 4] == 7);
  int64_t counts[10];
  EXPECT(data_images_check_labels(&s, counts, &e) == 0 && counts[0] == 1 && counts[4] == 1 && counts[5] == 0);
  data_images_close(&s);

  int32_t h[16] = {20261127, 1, 4, 3, 2, 2, 10};
  write_raw("good.img", h, 4 * 13);
  path_in(p, sizeof p, "good.img");
  EXPECT(data_images_open(&s, p, &e) == 0);
  data_images_close(&s);
  h[0] = 123;
  write_raw("magic.img", h, 4 * 13);
  expect_open_error("magic.img", "not an image file: magic 123 at byte 0, expected 20261127");
  h[0] = 20261127, h[1] = 2;
  write_raw("version.img", h, 4 * 13);
  expect_open_error("version.img", "unsupported version 2 at byte 4 (image files are version 1)");
  h[1] = 1, h[4] = 0;
  write_raw("height.img", h, 4 * 13);
  expect_open_error("height.img", "height 0 at byte 16: must be at least 1");
  h[4] = 2, h[6] = 300;
  write_raw("classes.img", h, 4 * 13);
  expect_open_error("classes.img", "classes 300 at byte 24: must be 1 to 256 (a label is one byte)");
  h[6] = 10, h[9] = 5;
  write_raw("reserved.img", h, 4 * 13);
  expect_open_error("reserved.img", "reserved header field 9 at byte 36 is 5, expected 0");
  h[9] = 0, h[2] = -1;
  write_raw("neg.img", h, 0);
  expect_open_error("neg.img", "negative image count -1 at byte 8");
  h[2] = 4;
  write_raw("short.img", h, 2 * 13 + 5); /* images 0 and 1 whole, 2 cut */
  expect_open_error("short.img", "truncated: the header (byte 8) announces 4 images of 13 bytes (a label byte and 3x2x2 pixels), "
                                 "which end at byte 116, but the file ends at byte 95 (image 2, at byte 90, is the first missing one)");
  write_raw("long.img", h, 4 * 13 + 3);
  expect_open_error("long.img", "3 unexpected bytes after the 4 images the header (byte 8) announces, from byte 116");
  path_in(p, sizeof p, "tiny.img");
  FILE *tf = fopen(p, "wb");
  fwrite(h, 1, 10, tf);
  fclose(tf);
  expect_open_error("tiny.img", "truncated: 10 bytes, shorter than the 64-byte header of an image file");
  expect_open_error("missing.img", "No such file");
  /* a huge count does not overflow the size arithmetic */
  h[2] = 0x7fffffff, h[3] = h[4] = h[5] = 65536;
  write_raw("huge.img", h, 0);
  expect_open_error("huge.img", "more than 2^40 pixels each");
  h[3] = h[4] = h[5] = 8192; /* 2^39 pixels, 2^31 images: 2^70 bytes */
  write_raw("huge2.img", h, 0);
  expect_open_error("huge2.img", "which end at byte more than 2^63");

  /* a label >= K: found by the check, naming the image and its byte */
  unsigned char *r = numbered(0, 4, 3, 2, 2, 10);
  r[2 * 13] = 12;
  int32_t hh[16] = {20261127, 1, 4, 3, 2, 2, 10};
  write_body("label.img", hh, r, 4 * 13);
  path_in(p, sizeof p, "label.img");
  EXPECT(data_images_open(&s, p, &e) == 0);
  EXPECT(data_images_check_labels(&s, NULL, &e) < 0);
  EXPECT_ERR(e.msg, "label.img: image 2 (its label at byte 90) has label 12, not below the 10 classes of the header (byte 24)");
  data_images_close(&s);
  EXPECT(data_images_write(p, 4, 3, 2, 2, 10, r, &e) < 0); /* the writer refuses it */
  EXPECT_ERR(e.msg, "image 2 has label 12, not below 10 classes");
  free(r);
  /* from memory, as the fuzzer reads */
  unsigned char mem[64 + 13] = {0};
  hh[2] = 1;
  for (int i = 0; i < 7; i++)
    for (int k = 0; k < 4; k++) mem[4 * i + k] = (unsigned char)((uint32_t)hh[i] >> (8 * k));
  EXPECT(data_images_open_mem(&s, "mem.img", mem, sizeof mem, &e) == 0 && s.count == 1);
  data_images_close(&s);
  EXPECT(data_images_open_mem(&s, "mem.img", mem, sizeof mem - 1, &e) < 0);
  EXPECT_ERR(e.msg, "mem.img: truncated");
}

static void test_shape_rule(void) {
  int64_t chw[3] = {3, 32, 32}, hw[2] = {28, 28}, one[3] = {1, 28, 28}, flat[1] = {3072}, other[3] = {3, 16, 16}, lead[4] = {1, 3, 32, 32};
  EXPECT(data_image_shape_fits(chw, 3, 3, 32, 32));
  EXPECT(!data_image_shape_fits(chw, 3, 1, 32, 32));
  EXPECT(data_image_shape_fits(hw, 2, 1, 28, 28));
  EXPECT(data_image_shape_fits(one, 3, 1, 28, 28));
  EXPECT(!data_image_shape_fits(hw, 2, 3, 28, 28));
  EXPECT(data_image_shape_fits(flat, 1, 3, 32, 32));
  EXPECT(!data_image_shape_fits(flat, 1, 3, 16, 16));
  EXPECT(!data_image_shape_fits(other, 3, 3, 32, 32));
  EXPECT(data_image_shape_fits(lead, 4, 3, 32, 32));
}

static DataLoader *open_images(const char *pattern, int64_t B, int rank, int n, int shuffle, int prefetch, int64_t start,
                               const int64_t *dims, int rank_dims, int64_t classes, RtErr *e) {
  char p[512];
  path_in(p, sizeof p, pattern);
  DataConfig c;
  memset(&c, 0, sizeof c);
  c.pattern = p, c.batch = B, c.rank = rank, c.nranks = n, c.seed = 7, c.shuffle = shuffle, c.prefetch = prefetch, c.start = start;
  DataImageSpec s;
  memset(&s, 0, sizeof s);
  s.rank = rank_dims;
  memcpy(s.dims, dims, sizeof(int64_t) * (size_t)rank_dims);
  s.classes = classes;
  s.input = "x";
  return data_loader_open_images(&c, &s, e);
}

static const int64_t D322[3] = {3, 2, 2};

/* The global set of images of micro-batch j at dp = n: rank r's batch b is
 * stream position (j*B + b)*n + r. Identified by label and first pixel. */
static void test_loader(void) {
  write_numbered("set_0.img", 0, 7, 3, 2, 2, 100);
  write_numbered("set_1.img", 1, 6, 3, 2, 2, 100);
  RtErr e;
  DataLoader *L = open_images("set_*.img", 2, 0, 1, 0, 0, 0, D322, 3, 0, &e);
  EXPECT(L != NULL);
  if (!L) return;
  EXPECT(data_loader_windows(L) == 13 && data_loader_nshards(L) == 2 && data_loader_shard(L, 0) == NULL);
  EXPECT(data_loader_images(L, 1) && data_loader_images(L, 1)->count == 6);
  /* in order, no shuffle: positions 0, 1 then 2, 3; the 8th image is file 1's first */
  const DataBatch *b = data_loader_next(L, &e);
  EXPECT(b && b->image_elems == 12 && b->labels[0] == 0 && b->labels[1] == 1 && b->inputs == NULL && b->seq_len == 0);
  EXPECT(b && b->images[0] == data_pixel(0) && b->images[12 + 5] == data_pixel(6));
  EXPECT(data_pixel(0) == -0.5f && data_pixel(255) == 0.5f);
  data_loader_seek(L, 3); /* positions 6, 7 */
  b = data_loader_next(L, &e);
  EXPECT(b && b->labels[0] == 6 && b->labels[1] == 0 && b->images[12] == data_pixel(100)); /* file 1's image 0 */
  /* the token reader refuses */
  int32_t in[4], tg[4];
  EXPECT(data_loader_fill(L, 0, in, tg, &e) < 0);
  data_loader_close(L);

  /* rank 1 of 2 takes positions (j*B + b)*2 + 1: micro-batch 0 is 1, 3;
   * micro-batch 1 is 5, 7 (file 1's first image, label 0) */
  L = open_images("set_*.img", 2, 1, 2, 0, 0, 0, D322, 3, 0, &e);
  EXPECT(L != NULL);
  if (!L) return;
  b = data_loader_next(L, &e);
  EXPECT(b && b->labels[0] == 1 && b->labels[1] == 3);
  b = data_loader_next(L, &e);
  EXPECT(b && b->labels[0] == 5 && b->labels[1] == 0 && b->images[12] == data_pixel(100));
  data_loader_close(L);

  /* layout independence: step s (global batch 4) reads the same images at
   * dp 1 x B 4 and dp 2 x B 2, shuffled */
  DataLoader *one = open_images("set_*.img", 4, 0, 1, 1, 0, 0, D322, 3, 0, &e);
  DataLoader *r0 = open_images("set_*.img", 2, 0, 2, 1, 1, 0, D322, 3, 0, &e);
  DataLoader *r1 = open_images("set_*.img", 2, 1, 2, 1, 1, 0, D322, 3, 0, &e);
  EXPECT(one && r0 && r1);
  if (!one || !r0 || !r1) return;
  int seen[200] = {0};
  for (int step = 0; step < 9; step++) { /* into the third epoch */
    float img1[4 * 12], img2[2 * 12];
    int32_t lab1[4], lab2[2];
    EXPECT(data_loader_fill_images(one, step, img1, lab1, &e) == 0);
    int got[200] = {0}, want[200] = {0};
    for (int k = 0; k < 4; k++) want[lab1[k] + 100 * (img1[k * 12] != data_pixel((unsigned char)lab1[k]))]++;
    for (int r = 0; r < 2; r++) {
      const DataBatch *mb = data_loader_next(r ? r1 : r0, &e);
      EXPECT(mb != NULL);
      if (!mb) return;
      memcpy(img2, mb->images, sizeof img2);
      memcpy(lab2, mb->labels, sizeof lab2);
      for (int k = 0; k < 2; k++) got[lab2[k] + 100 * (img2[k * 12] != data_pixel((unsigned char)lab2[k]))]++;
    }
    EXPECT(!memcmp(got, want, sizeof got));
    for (int k = 0; step < 3 && k < 200; k++) seen[k] += want[k];
  }
  /* steps 0-2 are positions 0..11 of epoch 0: 12 different images */
  int distinct = 0;
  for (int k = 0; k < 200; k++) distinct += seen[k] == 1;
  EXPECT(distinct == 12);
  /* resuming after 2 steps (8 images) reads what step 2 read */
  DataLoader *st = open_images("set_*.img", 4, 0, 1, 1, 1, 8, D322, 3, 0, &e);
  float a[4 * 12], c[4 * 12];
  int32_t la[4], lc[4];
  b = st ? data_loader_next(st, &e) : NULL;
  EXPECT(b != NULL);
  EXPECT(data_loader_fill_images(one, 2, c, lc, &e) == 0);
  if (b) {
    memcpy(a, b->images, sizeof a);
    memcpy(la, b->labels, sizeof la);
    EXPECT(!memcmp(a, c, sizeof a) && !memcmp(la, lc, sizeof la));
  }
  data_loader_close(st);
  data_loader_close(one);
  data_loader_close(r0);
  data_loader_close(r1);
}

static void test_loader_errors(void) {
  RtErr e;
  /* the shape against the model's */
  int64_t d16[3] = {3, 16, 16};
  EXPECT(open_images("set_*.img", 2, 0, 1, 0, 0, 0, d16, 3, 0, &e) == NULL);
  EXPECT_ERR(e.msg, "set_0.img: images of 3x2x2 (C, H, W at bytes 12, 16, 20), but the model's input x is [B, 3, 16, 16]");
  /* the classes: the file's at most the model's */
  write_numbered("k_0.img", 0, 4, 3, 2, 2, 20);
  EXPECT(open_images("k_*.img", 2, 0, 1, 0, 0, 0, D322, 3, 10, &e) == NULL);
  EXPECT_ERR(e.msg, "k_0.img: 20 classes (byte 24), more than the model's 10");
  /* files of different sizes */
  write_numbered("mixed_0.img", 0, 4, 3, 2, 2, 10);
  write_numbered("mixed_1.img", 0, 4, 1, 2, 6, 10);
  int64_t flat[1] = {12};
  EXPECT(open_images("mixed_*.img", 2, 0, 1, 0, 0, 0, flat, 1, 0, &e) == NULL);
  EXPECT_ERR(e.msg, "mixed_1.img: images of 1x2x6, but");
  /* a token shard for an image model, and an image file for a token model */
  char p[512];
  path_in(p, sizeof p, "tok.bin");
  uint32_t t[40] = {0};
  EXPECT(data_shard_write(p, t, 40, 1, &e) == 0);
  EXPECT(open_images("tok.bin", 2, 0, 1, 0, 0, 0, D322, 3, 0, &e) == NULL);
  EXPECT_ERR(e.msg, "tok.bin: a token shard (magic 20240520 at byte 0), but the model takes images (x: [B, 3, 2, 2]) with labels");
  DataConfig c;
  memset(&c, 0, sizeof c);
  path_in(p, sizeof p, "ok.img");
  c.pattern = p, c.batch = 1, c.seq_len = 4, c.nranks = 1;
  EXPECT(data_loader_open(&c, &e) == NULL);
  EXPECT_ERR(e.msg, "ok.img: an image file (magic 20261127 at byte 0), but the model takes token windows");
  EXPECT(open_images("none_*.img", 2, 0, 1, 0, 0, 0, D322, 3, 0, &e) == NULL);
  EXPECT_ERR(e.msg, "no image file matches");
  int32_t h[16] = {20261127, 1, 0, 3, 2, 2, 10};
  write_raw("empty.img", h, 0);
  EXPECT(open_images("empty.img", 2, 0, 1, 0, 0, 0, D322, 3, 0, &e) == NULL);
  EXPECT_ERR(e.msg, "empty.img: no images (the count at byte 8 is 0)");
  /* a bad label, met when read, naming the image and its byte */
  unsigned char *r = numbered(0, 4, 3, 2, 2, 10);
  r[3 * 13] = 200;
  h[2] = 4;
  write_body("badlabel.img", h, r, 4 * 13);
  free(r);
  DataLoader *L = open_images("badlabel.img", 2, 0, 1, 0, 1, 0, D322, 3, 10, &e);
  EXPECT(L != NULL);
  if (L) {
    EXPECT(data_loader_next(L, &e) != NULL); /* images 0, 1 */
    EXPECT(data_loader_next(L, &e) == NULL); /* 2, 3: 3 is bad */
    EXPECT_ERR(e.msg, "badlabel.img: image 3 (its label at byte 103) has label 200, not below the 10 classes of the header (byte 24)");
    data_loader_close(L);
  }
}

static void test_synthetic(void) {
  char prefix[512], p[600];
  path_in(prefix, sizeof prefix, "syn");
  DataSyntheticImages o = {100, 3, 8, 8, 10, 5, 0.1, 40};
  DataImagesReport rep;
  RtErr e;
  EXPECT(data_write_synthetic_images(&o, prefix, &rep, NULL, &e) == 0);
  EXPECT(rep.train_images == 90 && rep.val_images == 10 && rep.train_files == 3 && rep.val_files == 1);
  snprintf(p, sizeof p, "%s_train_000002.img", prefix);
  DataImages s;
  EXPECT(data_images_open(&s, p, &e) == 0 && s.count == 10 && s.classes == 10 && s.channels == 3 && s.height == 8);
  int64_t counts[10];
  EXPECT(data_images_check_labels(&s, counts, &e) == 0);
  /* deterministic: image 80 is the same whichever file holds it */
  unsigned char rec[1 + 192];
  data_synthetic_image(&o, 80, rec);
  EXPECT(!memcmp(rec, data_images_record(&s, 0), sizeof rec));
  data_images_close(&s);
  /* a class's images share its colour */
  double mean[10][3] = {{0}};
  int n[10] = {0};
  for (int64_t i = 0; i < 400; i++) {
    data_synthetic_image(&o, i, rec);
    n[rec[0]]++;
    for (int c = 0; c < 3; c++)
      for (int k = 0; k < 64; k++) mean[rec[0]][c] += rec[1 + c * 64 + k];
  }
  int classes_seen = 0;
  for (int k = 0; k < 10; k++) classes_seen += n[k] > 0;
  EXPECT(classes_seen == 10);
  /* class 0's hue is red, class 5's cyan: channel 0 brighter by more than 40 levels */
  EXPECT(mean[0][0] / (64.0 * n[0]) > mean[5][0] / (64.0 * n[5]) + 40);
  DataSyntheticImages bad = o;
  bad.classes = 1;
  EXPECT(data_write_synthetic_images(&bad, prefix, &rep, NULL, &e) < 0);
  EXPECT_ERR(e.msg, "1 classes: synthetic images have 2 to 256");
  bad = o, bad.count = 1, bad.val_fraction = 0.9;
  EXPECT(data_write_synthetic_images(&bad, prefix, &rep, NULL, &e) < 0);
  EXPECT_ERR(e.msg, "leave none to train on");
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hpdl_test_images.XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_header();
  test_shape_rule();
  test_loader();
  test_loader_errors();
  test_synthetic();
  if (!test_failures) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  TEST_DONE();
}
