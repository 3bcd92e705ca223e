/* test_rt_data.c - token shards and the loader: the header and its errors
 * (file and byte named), windows and their targets at known positions, the
 * data-parallel split, the permutation, layout independence of a step's
 * windows, prefetching, resuming, and the text converter. */
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

static void write_raw(const char *name, const int32_t *hdr3, const void *tokens, size_t bytes, size_t cut) {
  char p[512];
  path_in(p, sizeof p, name);
  unsigned char *buf = calloc(1, 1024 + bytes);
  memcpy(buf, hdr3, 12);
  if (bytes) memcpy(buf + 1024, tokens, bytes);
  FILE *f = fopen(p, "wb");
  fwrite(buf, 1, 1024 + bytes - cut, f);
  fclose(f);
  free(buf);
}

/* Shard s holds tokens s*1000 + i (uint32, version 2), so a token tells
 * where it came from. */
static void write_numbered(const char *name, int s, int n) {
  uint32_t *t = malloc(sizeof *t * (size_t)n);
  for (int i = 0; i < n; i++) t[i] = (uint32_t)(s * 1000 + i);
  char p[512];
  path_in(p, sizeof p, name);
  RtErr e;
  EXPECT(data_shard_write(p, t, n, 2, &e) == 0);
  free(t);
}

static void test_shard_header(void) {
  char p[512];
  RtErr e;
  DataShard s;
  uint32_t toks[5] = {0, 1, 65535, 7, 300};
  path_in(p, sizeof p, "v1.bin");
  EXPECT(data_shard_write(p, toks, 5, 1, &e) == 0);
  EXPECT(data_shard_open(&s, p, &e) == 0);
  EXPECT(s.version == 1 && s.token_bytes == 2 && s.ntokens == 5);
  EXPECT(data_shard_token(&s, 2) == 65535 && data_shard_token(&s, 4) == 300);
  data_shard_close(&s);
  struct stat st;
  stat(p, &st);
  EXPECT(st.st_size == 1024 + 10);
  uint32_t big = 70000;
  EXPECT(data_shard_write(p, &big, 1, 1, &e) < 0);
  EXPECT_ERR(e.msg, "does not fit uint16");
  /* the header llm.c writes: magic, version, count at ints 0, 1, 2 */
  uint16_t t16[3] = {5, 6, 7};
  int32_t h1[3] = {20240520, 1, 3};
  write_raw("llmc.bin", h1, t16, 6, 0);
  path_in(p, sizeof p, "llmc.bin");
  EXPECT(data_shard_open(&s, p, &e) == 0 && data_shard_token(&s, 1) == 6);
  data_shard_close(&s);
  uint32_t t32[2] = {100000, 128255};
  int32_t h7[3] = {20240801, 7, 2}; /* llm.c's Llama-3 shards */
  write_raw("llama3.bin", h7, t32, 8, 0);
  path_in(p, sizeof p, "llama3.bin");
  EXPECT(data_shard_open(&s, p, &e) == 0 && data_shard_token(&s, 1) == 128255);
  data_shard_close(&s);
}

static void expect_open_error(const char *name, const char *needle) {
  char p[512];
  path_in(p, sizeof p, name);
  DataShard s;
  RtErr e;
  EXPECT(data_shard_open(&s, p, &e) < 0);
  EXPECT_ERR(e.msg, needle);
  EXPECT_ERR(e.msg, name); /* the file is named */
}

static void test_shard_errors(void) {
  uint16_t t[4] = {1, 2, 3, 4};
  int32_t magic[3] = {12345, 1, 4};
  write_raw("magic.bin", magic, t, 8, 0);
  expect_open_error("magic.bin", "magic 12345 at byte 0, expected 20240520");
  int32_t ver[3] = {20240520, 3, 4};
  write_raw("version.bin", ver, t, 8, 0);
  expect_open_error("version.bin", "unsupported version 3 at byte 4");
  int32_t ok[3] = {20240520, 1, 4};
  write_raw("trunc.bin", ok, t, 8, 3); /* 3 bytes short: token 2 is the first incomplete */
  expect_open_error("trunc.bin", "announces 4 tokens, which end at byte 1032, but the file ends at byte 1029 (token 2");
  write_raw("tail.bin", ok, t, 8, 0);
  char p[512];
  path_in(p, sizeof p, "tail.bin");
  FILE *f = fopen(p, "ab");
  fputs("xyz", f);
  fclose(f);
  expect_open_error("tail.bin", "3 unexpected bytes after the 4 tokens");
  path_in(p, sizeof p, "tiny.bin");
  f = fopen(p, "wb");
  fputs("hello", f);
  fclose(f);
  expect_open_error("tiny.bin", "truncated: 5 bytes, shorter than the 1024-byte header");
  int32_t neg[3] = {20240520, 1, -4};
  write_raw("neg.bin", neg, NULL, 0, 0);
  expect_open_error("neg.bin", "negative token count -4 at byte 8");
  expect_open_error("missing.bin", "No such file");
}

static DataLoader *open_loader(const char *pattern, int64_t B, int64_t T, int rank, int n, int shuffle, int prefetch, RtErr *e) {
  char p[512];
  path_in(p, sizeof p, pattern);
  DataConfig c = {p, B, T, rank, n, 99, shuffle, prefetch, 0, 0};
  return data_loader_open(&c, e);
}

static void test_windows_in_order(void) {
  /* shard 0: 25 tokens, shard 1: 17 tokens; T = 4: (25-1)/4 = 6 and
   * (17-1)/4 = 4 windows, W = 10 */
  write_numbered("ord_0.bin", 0, 25);
  write_numbered("ord_1.bin", 1, 17);
  RtErr e;
  DataLoader *L = open_loader("ord_*.bin", 2, 4, 1, 2, 0, 0, &e);
  EXPECT(L != NULL);
  if (!L) {
    fprintf(stderr, "%s\n", e.msg);
    return;
  }
  EXPECT(data_loader_windows(L) == 10 && data_loader_nshards(L) == 2);
  /* rank 1 of 2, micro-batch 0: positions (0*2+b)*2+1 = 1, 3 -> windows 1, 3
   * = shard 0 at tokens 4 and 12 */
  const DataBatch *b = data_loader_next(L, &e);
  int32_t want_in[8] = {4, 5, 6, 7, 12, 13, 14, 15}, want_tg[8] = {5, 6, 7, 8, 13, 14, 15, 16};
  EXPECT(!memcmp(b->inputs, want_in, sizeof want_in) && !memcmp(b->targets, want_tg, sizeof want_tg));
  /* micro-batch 1: positions 5, 7 -> window 5 (shard 0 at 20: tokens 20..24)
   * and window 7 (shard 1's second: 1004..1008) */
  b = data_loader_next(L, &e);
  int32_t w2_in[8] = {20, 21, 22, 23, 1004, 1005, 1006, 1007}, w2_tg[8] = {21, 22, 23, 24, 1005, 1006, 1007, 1008};
  EXPECT(!memcmp(b->inputs, w2_in, sizeof w2_in) && !memcmp(b->targets, w2_tg, sizeof w2_tg));
  EXPECT(b->index == 1 && b->epoch == 0);
  /* micro-batch 2: positions 9, 11 -> window 9 (shard 1 at 12), then the
   * next epoch's window 1 */
  b = data_loader_next(L, &e);
  EXPECT(b->inputs[0] == 1012 && b->targets[3] == 1016 && b->inputs[4] == 4);
  data_loader_close(L);
}

static void test_permutation(void) {
  int64_t sizes[] = {1, 2, 3, 5, 17, 100, 1000, 4097};
  for (int k = 0; k < 8; k++) {
    int64_t n = sizes[k];
    char *seen = calloc((size_t)n, 1);
    int moved = 0;
    for (int64_t i = 0; i < n; i++) {
      int64_t j = data_permute(i, n, 12345);
      EXPECT(j >= 0 && j < n);
      if (j >= 0 && j < n) seen[j]++;
      moved += j != i;
      EXPECT(j == data_permute(i, n, 12345)); /* deterministic */
    }
    for (int64_t i = 0; i < n; i++) EXPECT(seen[i] == 1); /* a bijection */
    if (n >= 17) EXPECT(moved > n / 2);                  /* and a real shuffle */
    free(seen);
  }
  int differ = 0;
  for (int64_t i = 0; i < 100; i++) differ += data_permute(i, 100, 1) != data_permute(i, 100, 2);
  EXPECT(differ > 50); /* another key, another order */
}

/* With shuffling, dp ranks read disjoint windows covering the epoch, and
 * a step's set of windows does not depend on how it is split: dp=2 x B=2
 * reads what dp=1 x B=4 reads. */
static void test_sharding_and_layout_independence(void) {
  write_numbered("sh_0.bin", 0, 65); /* T = 4: 16 windows */
  write_numbered("sh_1.bin", 1, 33); /* 8 windows: W = 24 */
  RtErr e;
  DataLoader *r0 = open_loader("sh_*.bin", 2, 4, 0, 2, 1, 0, &e), *r1 = open_loader("sh_*.bin", 2, 4, 1, 2, 1, 0, &e),
             *one = open_loader("sh_*.bin", 4, 4, 0, 1, 1, 0, &e);
  EXPECT(r0 && r1 && one);
  if (!r0 || !r1 || !one) return;
  int seen[2000] = {0};
  for (int j = 0; j < 6; j++) { /* 6 micro-batches x 2 x 2 ranks = 24 windows: one epoch */
    int32_t in0[8], tg0[8], in1[8], tg1[8], all[16], alltg[16];
    EXPECT(data_loader_fill(r0, j, in0, tg0, &e) == 0);
    EXPECT(data_loader_fill(r1, j, in1, tg1, &e) == 0);
    EXPECT(data_loader_fill(one, j, all, alltg, &e) == 0);
    seen[in0[0]]++;
    seen[in0[4]]++;
    seen[in1[0]]++;
    seen[in1[4]]++;
    /* position (j*2+b)*2+r of dp=2 is position j*4 + 2b + r of dp=1 */
    EXPECT(!memcmp(in0, all, 4 * sizeof(int32_t)));           /* b=0, r=0: position 0 */
    EXPECT(!memcmp(in1, all + 4, 4 * sizeof(int32_t)));       /* b=0, r=1: position 1 */
    EXPECT(!memcmp(in0 + 4, all + 8, 4 * sizeof(int32_t)));   /* b=1, r=0: position 2 */
    EXPECT(!memcmp(tg1 + 4, alltg + 12, 4 * sizeof(int32_t))); /* b=1, r=1: position 3 */
  }
  int windows = 0;
  for (int t = 0; t < 2000; t++) {
    EXPECT(seen[t] <= 1);
    windows += seen[t];
  }
  EXPECT(windows == 24);
  for (int w = 0; w < 16; w++) EXPECT(seen[w * 4] == 1);
  for (int w = 0; w < 8; w++) EXPECT(seen[1000 + w * 4] == 1);
  /* a new epoch, a new order (same windows) */
  int32_t a[16], at[16], b[16], bt[16];
  int same = 1;
  for (int j = 0; j < 6; j++) {
    data_loader_fill(one, j, a, at, &e);
    data_loader_fill(one, j + 6, b, bt, &e);
    same &= !memcmp(a, b, sizeof a);
  }
  EXPECT(!same);
  data_loader_close(r0);
  data_loader_close(r1);
  data_loader_close(one);
}

static void test_prefetch_seek_and_start(void) {
  RtErr e;
  DataLoader *pf = open_loader("sh_*.bin", 3, 4, 1, 3, 1, 1, &e), *plain = open_loader("sh_*.bin", 3, 4, 1, 3, 1, 0, &e);
  EXPECT(pf && plain);
  if (!pf || !plain) return;
  int32_t in[12], tg[12];
  for (int j = 0; j < 20; j++) {
    const DataBatch *b = data_loader_next(pf, &e);
    EXPECT(b && b->index == j);
    data_loader_fill(plain, j, in, tg, &e);
    EXPECT(b && !memcmp(b->inputs, in, sizeof in) && !memcmp(b->targets, tg, sizeof tg));
  }
  data_loader_seek(pf, 7); /* resuming: the 8th micro-batch next */
  const DataBatch *b = data_loader_next(pf, &e);
  data_loader_fill(plain, 7, in, tg, &e);
  EXPECT(b && b->index == 7 && !memcmp(b->inputs, in, sizeof in));
  b = data_loader_next(pf, &e);
  data_loader_fill(plain, 8, in, tg, &e);
  EXPECT(b && !memcmp(b->inputs, in, sizeof in));
  data_loader_close(pf);
  /* start: a run resumed after 2 x 9 sequences reads what micro-batch 2
   * of the first run read */
  char p[512];
  path_in(p, sizeof p, "sh_*.bin");
  DataConfig c = {p, 3, 4, 1, 3, 99, 1, 1, 0, 2 * 9};
  DataLoader *st = data_loader_open(&c, &e);
  EXPECT(st != NULL);
  b = data_loader_next(st, &e);
  data_loader_fill(plain, 2, in, tg, &e);
  EXPECT(b && !memcmp(b->inputs, in, sizeof in));
  data_loader_close(st);
  data_loader_close(plain);
}

static void test_loader_errors(void) {
  RtErr e;
  write_numbered("few_0.bin", 0, 4);
  EXPECT(open_loader("few_*.bin", 1, 4, 0, 1, 0, 0, &e) == NULL);
  EXPECT_ERR(e.msg, "4 tokens (the count at byte 8), fewer than the 5 (sequence length + 1) one window needs");
  EXPECT_ERR(e.msg, "few_0.bin");
  EXPECT(open_loader("nothing_*.bin", 1, 4, 0, 1, 0, 0, &e) == NULL);
  EXPECT_ERR(e.msg, "no token file matches");
  EXPECT(open_loader("nothing.bin", 1, 4, 0, 1, 0, 0, &e) == NULL);
  EXPECT_ERR(e.msg, "No such file");
  int32_t magic[3] = {7, 1, 4};
  uint16_t t[4] = {0};
  write_raw("mix_1.bin", magic, t, 8, 0);
  write_numbered("mix_0.bin", 0, 40);
  EXPECT(open_loader("mix_*.bin", 1, 4, 0, 1, 0, 0, &e) == NULL);
  EXPECT_ERR(e.msg, "mix_1.bin: not a token shard: magic 7 at byte 0");
  /* a token outside the vocabulary: found when read, with its byte */
  char p[512];
  path_in(p, sizeof p, "ord_0.bin");
  DataConfig c = {p, 1, 4, 0, 1, 0, 0, 0, 16, 0}; /* tokens 0..24, vocab 16 */
  DataLoader *L = data_loader_open(&c, &e);
  EXPECT(L != NULL);
  EXPECT(data_loader_next(L, &e) != NULL);      /* tokens 0..4 */
  EXPECT(data_loader_next(L, &e) != NULL);      /* 4..8 */
  EXPECT(data_loader_next(L, &e) != NULL);      /* 8..12 */
  EXPECT(data_loader_next(L, &e) == NULL);      /* 12..16: 16 is outside */
  EXPECT_ERR(e.msg, "token 16 at byte 1088 is outside the model's vocabulary of 16"); /* 1024 + 16 x 4 */
  data_loader_close(L);
}

static void test_convert(void) {
  const char *text = "hello, world! 0123456789";
  char prefix[512], p[600];
  path_in(prefix, sizeof prefix, "txt");
  DataConvertOptions o = {0.25, 10};
  DataConvertReport r;
  RtErr e;
  EXPECT(data_convert_bytes((const unsigned char *)text, 24, prefix, &o, &r, NULL, &e) == 0);
  EXPECT(r.train_tokens == 18 && r.val_tokens == 6 && r.train_shards == 2 && r.val_shards == 1);
  DataShard s;
  snprintf(p, sizeof p, "%s_train_000001.bin", prefix);
  EXPECT(data_shard_open(&s, p, &e) == 0);
  EXPECT(s.ntokens == 8 && data_shard_token(&s, 0) == 'l' && data_shard_token(&s, 7) == '3'); /* bytes 10..17: "ld! 0123" */
  data_shard_close(&s);
  snprintf(p, sizeof p, "%s_val_000000.bin", prefix);
  EXPECT(data_shard_open(&s, p, &e) == 0);
  EXPECT(s.ntokens == 6 && data_shard_token(&s, 0) == '4' && data_shard_token(&s, 5) == '9');
  data_shard_close(&s);
  o.val_fraction = 1.5;
  EXPECT(data_convert_bytes((const unsigned char *)text, 24, prefix, &o, &r, NULL, &e) < 0);
  /* synthetic text: exactly the length asked, printable, deterministic */
  char a[5000], b[5000];
  data_synthetic_text(a, 5000, 3);
  data_synthetic_text(b, 5000, 3);
  EXPECT(!memcmp(a, b, sizeof a));
  int printable = 1;
  for (int i = 0; i < 5000; i++) printable &= (a[i] >= ' ' && a[i] <= '~') || a[i] == '\n';
  EXPECT(printable);
  data_synthetic_text(b, 5000, 4);
  EXPECT(memcmp(a, b, sizeof a) != 0);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hpdl_test_rt_data.XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_shard_header();
  test_shard_errors();
  test_windows_in_order();
  test_permutation();
  test_sharding_and_layout_independence();
  test_prefetch_seek_and_start();
  test_loader_errors();
  test_convert();
  if (!test_failures) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  TEST_DONE();
}
