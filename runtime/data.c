/* data.c - token shards, image files, the window order, the prefetching
 * loader, the text converter and the synthetic images. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- shards ---- */

static int32_t le32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* Checks a shard's header (its first DATA_HEADER_BYTES bytes) against the
 * file's size: the token width and count, or -1 with a message. */
static int check_header(const char *path, const unsigned char *hdr, int64_t size, int *version, int *token_bytes, int32_t *ntokens,
                        RtErr *e) {
  int32_t magic = le32(hdr), v = le32(hdr + 4), count = le32(hdr + 8);
  int tb = 0;
  if (magic == DATA_MAGIC) {
    if (v == 1) tb = 2;
    else if (v == 2) tb = 4;
    else
      return rt_fail(e, "%s: unsupported version %d at byte 4 (magic %d shards are version 1, uint16 tokens, or 2, uint32)", path,
                     v, DATA_MAGIC);
  } else if (magic == DATA_MAGIC_LLAMA3) {
    if (v != 7)
      return rt_fail(e, "%s: unsupported version %d at byte 4 (magic %d shards are version 7, uint32 tokens)", path, v,
                     DATA_MAGIC_LLAMA3);
    tb = 4;
  } else {
    return rt_fail(e, "%s: not a token shard: magic %d at byte 0, expected %d (llm.c's .bin layout: 256 int32 header, then tokens)",
                   path, magic, DATA_MAGIC);
  }
  if (count < 0) return rt_fail(e, "%s: negative token count %d at byte 8", path, count);
  int64_t want = DATA_HEADER_BYTES + (int64_t)count * tb;
  if (size < want)
    return rt_fail(e,
                   "%s: truncated: the header (byte 8) announces %d tokens, which end at byte %" PRId64
                   ", but the file ends at byte %" PRId64 " (token %" PRId64 " is the first missing one)",
                   path, count, want, size, (size - DATA_HEADER_BYTES) / tb);
  if (size > want)
    return rt_fail(e, "%s: %" PRId64 " unexpected bytes after the %d tokens the header (byte 8) announces, from byte %" PRId64, path,
                   size - want, count, want);
  *version = v;
  *token_bytes = tb;
  *ntokens = count;
  return 0;
}

static int too_short(const char *path, int64_t size, RtErr *e) {
  return rt_fail(e, "%s: truncated: %" PRId64 " bytes, shorter than the %d-byte header of a token shard", path, size,
                 DATA_HEADER_BYTES);
}

/* Opens path (a `what`), reads its first hdr_len (<= DATA_HEADER_BYTES) bytes,
 * has check judge them against the file's size (short: too_short's message
 * when the file cannot hold them), and maps the whole file read-only.
 * 0 with *map, *len set; -1 with the reason in e. */
typedef int (*HeaderCheck)(void *ctx, const char *path, const unsigned char *hdr, int64_t size, RtErr *e);
static int map_checked(const char *path, const char *what, size_t hdr_len, int (*too_short_fn)(const char *, int64_t, RtErr *),
                       HeaderCheck check, void *ctx, void **map, size_t *len, RtErr *e) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return rt_fail_errno(e, errno, "%s: cannot open the %s", path, what);
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int err = errno;
    close(fd);
    return rt_fail_errno(e, err, "%s: cannot stat", path);
  }
  int64_t size = (int64_t)st.st_size;
  unsigned char hdr[DATA_HEADER_BYTES];
  if (size < (int64_t)hdr_len) {
    close(fd);
    return too_short_fn(path, size, e);
  }
  ssize_t got = pread(fd, hdr, hdr_len, 0);
  if (got != (ssize_t)hdr_len) {
    int err = errno;
    close(fd);
    return rt_fail_errno(e, got < 0 ? err : EIO, "%s: cannot read the header", path);
  }
  if (check(ctx, path, hdr, size, e) < 0) {
    close(fd);
    return -1;
  }
  *len = (size_t)size;
  *map = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  close(fd);
  if (*map == MAP_FAILED) {
    *map = NULL;
    return rt_fail_errno(e, err, "%s: cannot map the file", path);
  }
  return 0;
}

typedef struct {
  int version, tb;
  int32_t count;
} ShardHeader;

static int shard_header_check(void *ctx, const char *path, const unsigned char *hdr, int64_t size, RtErr *e) {
  ShardHeader *h = ctx;
  return check_header(path, hdr, size, &h->version, &h->tb, &h->count, e);
}

int data_shard_open(DataShard *s, const char *path, RtErr *e) {
  memset(s, 0, sizeof *s);
  ShardHeader h = {0, 0, 0};
  if (map_checked(path, "token file", DATA_HEADER_BYTES, too_short, shard_header_check, &h, &s->map, &s->map_len, e) < 0) return -1;
  s->path = rt_strdup(path);
  if (!s->path) {
    munmap(s->map, s->map_len);
    s->map = NULL;
    return rt_fail(e, "%s: out of memory", path);
  }
  s->version = h.version;
  s->token_bytes = h.tb;
  s->ntokens = h.count;
  s->tokens = (const unsigned char *)s->map + DATA_HEADER_BYTES;
  return 0;
}

int data_shard_open_mem(DataShard *s, const char *name, const void *buf, size_t len, RtErr *e) {
  memset(s, 0, sizeof *s);
  int version = 0, tb = 0;
  int32_t count = 0;
  if (len < DATA_HEADER_BYTES) return too_short(name, (int64_t)len, e);
  if (check_header(name, buf, (int64_t)len, &version, &tb, &count, e) < 0) return -1;
  s->path = rt_strdup(name);
  if (!s->path) return rt_fail(e, "%s: out of memory", name);
  s->version = version;
  s->token_bytes = tb;
  s->ntokens = count;
  s->tokens = (const unsigned char *)buf + DATA_HEADER_BYTES;
  return 0;
}

void data_shard_close(DataShard *s) {
  if (s->map) munmap(s->map, s->map_len);
  rt_free(s->path);
  memset(s, 0, sizeof *s);
}

int data_shard_write(const char *path, const uint32_t *tokens, int64_t n, int version, RtErr *e) {
  if (version != 1 && version != 2) return rt_fail(e, "%s: version %d: only 1 (uint16) and 2 (uint32) are written", path, version);
  if (n < 0 || n > INT32_MAX) return rt_fail(e, "%s: %" PRId64 " tokens do not fit a shard's int32 count", path, n);
  int tb = version == 1 ? 2 : 4;
  size_t len = DATA_HEADER_BYTES + (size_t)n * (size_t)tb;
  unsigned char *buf = rt_calloc(1, len);
  if (!buf) return rt_fail(e, "%s: out of memory", path);
  int32_t hdr[3] = {DATA_MAGIC, version, (int32_t)n};
  memcpy(buf, hdr, sizeof hdr);
  for (int64_t i = 0; i < n; i++) {
    uint32_t t = tokens[i];
    unsigned char *p = buf + DATA_HEADER_BYTES + i * tb;
    if (tb == 2) {
      if (t > 0xffff) {
        rt_free(buf);
        return rt_fail(e, "%s: token %" PRIu32 " (index %" PRId64 ") does not fit uint16; write version 2", path, t, i);
      }
      p[0] = (unsigned char)t;
      p[1] = (unsigned char)(t >> 8);
    } else {
      memcpy(p, &t, 4);
    }
  }
  int rc = rt_write_file_atomic(path, buf, len, e);
  rt_free(buf);
  return rc;
}

/* ---- image files ---- */

static const char *const image_field[DATA_IMAGE_HEADER_INTS] = {"magic", "version", "count", "channels", "height", "width", "classes"};

/* Checks an image file's header against the file's size; fills s's counts
 * (not its pointers), or -1 with a message. */
static int check_image_header(const char *path, const unsigned char *hdr, int64_t size, DataImages *s, RtErr *e) {
  int32_t h[DATA_IMAGE_HEADER_INTS];
  for (int i = 0; i < DATA_IMAGE_HEADER_INTS; i++) h[i] = le32(hdr + 4 * i);
  if (h[0] != DATA_IMAGE_MAGIC)
    return rt_fail(e, "%s: not an image file: magic %d at byte 0, expected %d (a 64-byte header of 16 int32, then records of a label "
                   "byte and C*H*W pixel bytes)",
                   path, h[0], DATA_IMAGE_MAGIC);
  if (h[1] != DATA_IMAGE_VERSION)
    return rt_fail(e, "%s: unsupported version %d at byte 4 (image files are version %d)", path, h[1], DATA_IMAGE_VERSION);
  if (h[2] < 0) return rt_fail(e, "%s: negative image count %d at byte 8", path, h[2]);
  for (int i = 3; i <= 5; i++)
    if (h[i] < 1) return rt_fail(e, "%s: %s %d at byte %d: must be at least 1", path, image_field[i], h[i], 4 * i);
  if (h[6] < 1 || h[6] > DATA_IMAGE_MAX_CLASSES)
    return rt_fail(e, "%s: classes %d at byte 24: must be 1 to %d (a label is one byte)", path, h[6], DATA_IMAGE_MAX_CLASSES);
  for (int i = 7; i < DATA_IMAGE_HEADER_INTS; i++)
    if (h[i] != 0)
      return rt_fail(e, "%s: reserved header field %d at byte %d is %d, expected 0 (a file of a later version?)", path, i, 4 * i, h[i]);
  /* each dimension < 2^31: the product of three fits int64 */
  int64_t pixels = (int64_t)h[3] * h[4] * h[5];
  if (pixels > ((int64_t)1 << 40))
    return rt_fail(e, "%s: images of %dx%dx%d (bytes 12-20): more than 2^40 pixels each", path, h[3], h[4], h[5]);
  int64_t rec = 1 + pixels, body = size - DATA_IMAGE_HEADER_BYTES, have = body / rec;
  if (h[2] > have) {
    char end[64];
    if (h[2] <= (INT64_MAX - DATA_IMAGE_HEADER_BYTES) / rec) snprintf(end, sizeof end, "%" PRId64, DATA_IMAGE_HEADER_BYTES + h[2] * rec);
    else snprintf(end, sizeof end, "more than 2^63");
    return rt_fail(e,
                   "%s: truncated: the header (byte 8) announces %d images of %" PRId64 " bytes (a label byte and %dx%dx%d pixels), "
                   "which end at byte %s, but the file ends at byte %" PRId64 " (image %" PRId64 ", at byte %" PRId64
                   ", is the first missing one)",
                   path, h[2], rec, h[3], h[4], h[5], end, size, have, DATA_IMAGE_HEADER_BYTES + have * rec);
  }
  int64_t want = DATA_IMAGE_HEADER_BYTES + h[2] * rec;
  if (size > want)
    return rt_fail(e, "%s: %" PRId64 " unexpected bytes after the %d images the header (byte 8) announces, from byte %" PRId64, path,
                   size - want, h[2], want);
  s->version = h[1];
  s->count = h[2];
  s->channels = h[3];
  s->height = h[4];
  s->width = h[5];
  s->classes = h[6];
  s->record_bytes = rec;
  return 0;
}

static int image_too_short(const char *path, int64_t size, RtErr *e) {
  return rt_fail(e, "%s: truncated: %" PRId64 " bytes, shorter than the %d-byte header of an image file", path, size,
                 DATA_IMAGE_HEADER_BYTES);
}

static int image_header_check(void *ctx, const char *path, const unsigned char *hdr, int64_t size, RtErr *e) {
  return check_image_header(path, hdr, size, ctx, e);
}

int data_images_open(DataImages *s, const char *path, RtErr *e) {
  memset(s, 0, sizeof *s);
  if (map_checked(path, "image file", DATA_IMAGE_HEADER_BYTES, image_too_short, image_header_check, s, &s->map, &s->map_len, e) < 0)
    return -1;
  s->path = rt_strdup(path);
  if (!s->path) {
    munmap(s->map, s->map_len);
    s->map = NULL;
    return rt_fail(e, "%s: out of memory", path);
  }
  s->records = (const unsigned char *)s->map + DATA_IMAGE_HEADER_BYTES;
  return 0;
}

int data_images_open_mem(DataImages *s, const char *name, const void *buf, size_t len, RtErr *e) {
  memset(s, 0, sizeof *s);
  if (len < DATA_IMAGE_HEADER_BYTES) return image_too_short(name, (int64_t)len, e);
  if (check_image_header(name, buf, (int64_t)len, s, e) < 0) return -1;
  s->path = rt_strdup(name);
  if (!s->path) return rt_fail(e, "%s: out of memory", name);
  s->records = (const unsigned char *)buf + DATA_IMAGE_HEADER_BYTES;
  return 0;
}

void data_images_close(DataImages *s) {
  if (s->map) munmap(s->map, s->map_len);
  rt_free(s->path);
  memset(s, 0, sizeof *s);
}

static int bad_label(const DataImages *s, int64_t i, RtErr *e) {
  return rt_fail(e, "%s: image %" PRId64 " (its label at byte %" PRId64 ") has label %u, not below the %" PRId64
                 " classes of the header (byte 24)",
                 s->path, i, (int64_t)DATA_IMAGE_HEADER_BYTES + i * s->record_bytes, data_images_record(s, i)[0], s->classes);
}

int data_images_check_labels(const DataImages *s, int64_t *counts, RtErr *e) {
  if (counts) memset(counts, 0, sizeof *counts * (size_t)s->classes);
  for (int64_t i = 0; i < s->count; i++) {
    unsigned y = data_images_record(s, i)[0];
    if (y >= (uint64_t)s->classes) return bad_label(s, i, e);
    if (counts) counts[y]++;
  }
  return 0;
}

int data_images_write(const char *path, int64_t n, int64_t channels, int64_t height, int64_t width, int64_t classes,
                      const unsigned char *records, RtErr *e) {
  if (n < 0 || n > INT32_MAX) return rt_fail(e, "%s: %" PRId64 " images do not fit the header's int32 count", path, n);
  if (channels < 1 || height < 1 || width < 1 || channels > INT32_MAX || height > INT32_MAX || width > INT32_MAX)
    return rt_fail(e, "%s: bad image size %" PRId64 "x%" PRId64 "x%" PRId64, path, channels, height, width);
  if (classes < 1 || classes > DATA_IMAGE_MAX_CLASSES) return rt_fail(e, "%s: %" PRId64 " classes: 1 to 256 fit a label byte", path, classes);
  int64_t rec = 1 + channels * height * width;
  if (rec > ((int64_t)1 << 40) || (n > 0 && rec > (((int64_t)1 << 46) / n))) return rt_fail(e, "%s: too many pixels for one file", path);
  for (int64_t i = 0; i < n; i++)
    if (records[i * rec] >= classes)
      return rt_fail(e, "%s: image %" PRId64 " has label %u, not below %" PRId64 " classes", path, i, records[i * rec], classes);
  size_t len = DATA_IMAGE_HEADER_BYTES + (size_t)(n * rec);
  unsigned char *buf = rt_calloc(1, len);
  if (!buf) return rt_fail(e, "%s: out of memory", path);
  int32_t hdr[7] = {DATA_IMAGE_MAGIC, DATA_IMAGE_VERSION, (int32_t)n, (int32_t)channels, (int32_t)height, (int32_t)width, (int32_t)classes};
  for (int i = 0; i < 7; i++)
    for (int b = 0; b < 4; b++) buf[4 * i + b] = (unsigned char)((uint32_t)hdr[i] >> (8 * b));
  if (n) memcpy(buf + DATA_IMAGE_HEADER_BYTES, records, (size_t)(n * rec));
  int rc = rt_write_file_atomic(path, buf, len, e);
  rt_free(buf);
  return rc;
}

int data_image_shape_fits(const int64_t *dims, int rank, int64_t c, int64_t h, int64_t w) {
  int64_t file[3] = {c, h, w};
  int f0 = 0, m0 = 0;
  while (f0 < 2 && file[f0] == 1) f0++;
  while (m0 < rank - 1 && dims[m0] == 1) m0++;
  if (rank - m0 == 1 && dims[m0] == c * h * w) return 1; /* flat */
  if (rank - m0 != 3 - f0) return 0;
  for (int i = 0; i < 3 - f0; i++)
    if (dims[m0 + i] != file[f0 + i]) return 0;
  return 1;
}

int data_file_magic(const char *path, int32_t *magic) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  unsigned char b[4];
  ssize_t got = pread(fd, b, 4, 0);
  close(fd);
  if (got != 4) return -1;
  *magic = le32(b);
  return 0;
}

/* ---- the window order ---- */

static uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t data_permute(int64_t i, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 2;
  while (bits < 62 && ((int64_t)1 << bits) < n) bits++;
  if (bits & 1) bits++;
  int half = bits / 2;
  uint64_t mask = ((uint64_t)1 << half) - 1, x = (uint64_t)i;
  do {
    uint64_t l = x >> half, r = x & mask;
    for (int round = 0; round < 4; round++) {
      uint64_t f = mix64(r ^ mix64(key + (uint64_t)round)) & mask;
      uint64_t t = l ^ f;
      l = r;
      r = t;
    }
    x = (l << half) | r;
  } while (x >= (uint64_t)n);
  return (int64_t)x;
}

/* ---- the loader ---- */

typedef struct {
  DataBatch b;
  char err[RT_ERR_LEN]; /* non-empty when filling failed */
} Slot;

struct DataLoader {
  DataConfig cfg;
  DataImageSpec img;
  char *img_input; /* img.input's copy */
  char *pattern;
  int images;        /* 1: image files (imgs), else token shards (shards) */
  DataShard *shards;
  DataImages *imgs;
  int nshards;       /* files of either kind */
  int64_t *first; /* first[i]: number of windows before shard i; first[nshards] = W */
  int64_t windows;
  int64_t next;   /* the index data_loader_next returns */
  Slot slot[2];   /* [0] handed to the caller, [1] the thread's */
  /* prefetch */
  int threaded;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  enum { PF_IDLE, PF_WORKING, PF_READY } state;
  int64_t want; /* the index the thread prepares */
  int quit;
};

int64_t data_loader_windows(const DataLoader *L) { return L->windows; }
int data_loader_nshards(const DataLoader *L) { return L->nshards; }
const DataShard *data_loader_shard(const DataLoader *L, int i) { return L->images ? NULL : &L->shards[i]; }
const DataImages *data_loader_images(const DataLoader *L, int i) { return L->images ? &L->imgs[i] : NULL; }

void data_loader_locate(const DataLoader *L, int64_t pos, int *shard, int64_t *offset) {
  int64_t epoch = pos / L->windows, idx = pos % L->windows;
  int64_t w = L->cfg.shuffle ? data_permute(idx, L->windows, mix64(L->cfg.seed ^ mix64((uint64_t)epoch))) : idx;
  int lo = 0, hi = L->nshards - 1; /* the last shard with first[s] <= w */
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (L->first[mid] <= w) lo = mid;
    else hi = mid - 1;
  }
  *shard = lo;
  *offset = (w - L->first[lo]) * (L->images ? 1 : L->cfg.seq_len);
}

int data_loader_fill(const DataLoader *L, int64_t index, int32_t *inputs, int32_t *targets, RtErr *e) {
  if (L->images) return rt_fail(e, "data loader: token windows asked of image files");
  int64_t B = L->cfg.batch, T = L->cfg.seq_len, n = L->cfg.nranks;
  for (int64_t b = 0; b < B; b++) {
    int64_t pos = L->cfg.start + (index * B + b) * n + L->cfg.rank;
    int s;
    int64_t off;
    data_loader_locate(L, pos, &s, &off);
    const DataShard *sh = &L->shards[s];
    int32_t *in = inputs + b * T, *tg = targets + b * T;
    for (int64_t t = 0; t <= T; t++) {
      uint32_t tok = data_shard_token(sh, off + t);
      if (L->cfg.vocab > 0 && tok >= (uint64_t)L->cfg.vocab)
        return rt_fail(e, "%s: token %" PRIu32 " at byte %" PRId64 " is outside the model's vocabulary of %" PRId64, sh->path, tok,
                       (int64_t)DATA_HEADER_BYTES + (off + t) * sh->token_bytes, L->cfg.vocab);
      if (t < T) in[t] = (int32_t)tok;
      if (t > 0) tg[t - 1] = (int32_t)tok;
    }
  }
  return 0;
}

int data_loader_fill_images(const DataLoader *L, int64_t index, float *images, int32_t *labels, RtErr *e) {
  if (!L->images) return rt_fail(e, "data loader: images asked of token shards");
  int64_t B = L->cfg.batch, n = L->cfg.nranks;
  for (int64_t b = 0; b < B; b++) {
    int64_t pos = L->cfg.start + (index * B + b) * n + L->cfg.rank, rec;
    int s;
    data_loader_locate(L, pos, &s, &rec);
    const DataImages *f = &L->imgs[s];
    const unsigned char *r = data_images_record(f, rec);
    if (r[0] >= f->classes) return bad_label(f, rec, e);
    int64_t px = f->record_bytes - 1;
    float *out = images + b * px;
    for (int64_t k = 0; k < px; k++) out[k] = data_pixel(r[1 + k]);
    labels[b] = r[0];
  }
  return 0;
}

static void fill_slot(DataLoader *L, Slot *s, int64_t index) {
  RtErr e;
  s->err[0] = 0;
  s->b.index = index;
  s->b.epoch = (L->cfg.start + index * L->cfg.batch * L->cfg.nranks + L->cfg.rank) / L->windows;
  int rc = L->images ? data_loader_fill_images(L, index, s->b.images, s->b.labels, &e)
                     : data_loader_fill(L, index, s->b.inputs, s->b.targets, &e);
  if (rc < 0) memcpy(s->err, e.msg, sizeof s->err);
}

static void *prefetch_main(void *arg) {
  DataLoader *L = arg;
  pthread_mutex_lock(&L->mu);
  for (;;) {
    while (L->state != PF_WORKING && !L->quit) pthread_cond_wait(&L->cv, &L->mu);
    if (L->quit) break;
    int64_t k = L->want;
    pthread_mutex_unlock(&L->mu);
    fill_slot(L, &L->slot[1], k);
    pthread_mutex_lock(&L->mu);
    L->state = PF_READY;
    pthread_cond_broadcast(&L->cv);
  }
  pthread_mutex_unlock(&L->mu);
  return NULL;
}

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* "[3, 32, 32]" */
static void dims_str(char *out, size_t n, const int64_t *d, int rank) {
  size_t at = 0;
  out[0] = 0;
  for (int i = 0; i < rank && at < n; i++) {
    int w = snprintf(out + at, n - at, "%s%" PRId64, i ? ", " : "[", d[i]);
    if (w < 0) break;
    at += (size_t)w;
  }
  if (at < n) snprintf(out + at, n - at, "]");
}

/* Opens file i of the loader in the format its magic names, which must be
 * the one the model takes; image files are checked against the model. */
static int open_file(DataLoader *L, const char *path, RtErr *e) {
  const DataConfig *cfg = &L->cfg;
  const DataImageSpec *img = &L->img;
  int32_t magic = 0;
  int known = data_file_magic(path, &magic) == 0;
  char shape[160];
  dims_str(shape, sizeof shape, img->dims, img->rank);
  const char *in = img->input ? img->input : "the image input";
  if (!L->images) {
    if (known && magic == DATA_IMAGE_MAGIC)
      return rt_fail(e, "%s: an image file (magic %d at byte 0), but the model takes token windows (integer [B, T] inputs and targets)",
                     path, magic);
    if (data_shard_open(&L->shards[L->nshards], path, e) < 0) return -1;
    L->nshards++;
    const DataShard *s = &L->shards[L->nshards - 1];
    if (s->ntokens < cfg->seq_len + 1)
      return rt_fail(e, "%s: %" PRId64 " tokens (the count at byte 8), fewer than the %" PRId64 " (sequence length + 1) one window needs",
                     s->path, s->ntokens, cfg->seq_len + 1);
    L->first[L->nshards] = L->first[L->nshards - 1] + (s->ntokens - 1) / cfg->seq_len;
    return 0;
  }
  if (known && (magic == DATA_MAGIC || magic == DATA_MAGIC_LLAMA3))
    return rt_fail(e, "%s: a token shard (magic %d at byte 0), but the model takes images (%s: [B, %s) with labels: give image files "
                   "(magic %d; hpdl-data --synthetic-images makes some)",
                   path, magic, in, shape + 1, DATA_IMAGE_MAGIC);
  if (data_images_open(&L->imgs[L->nshards], path, e) < 0) return -1;
  L->nshards++;
  const DataImages *f = &L->imgs[L->nshards - 1];
  if (!data_image_shape_fits(img->dims, img->rank, f->channels, f->height, f->width))
    return rt_fail(e, "%s: images of %" PRId64 "x%" PRId64 "x%" PRId64 " (C, H, W at bytes 12, 16, 20), but the model's input %s is "
                   "[B, %s",
                   path, f->channels, f->height, f->width, in, shape + 1);
  if (L->nshards > 1) {
    const DataImages *f0 = &L->imgs[0];
    if (f->channels != f0->channels || f->height != f0->height || f->width != f0->width)
      return rt_fail(e, "%s: images of %" PRId64 "x%" PRId64 "x%" PRId64 ", but %s's are %" PRId64 "x%" PRId64 "x%" PRId64, path,
                     f->channels, f->height, f->width, f0->path, f0->channels, f0->height, f0->width);
  }
  if (img->classes > 0 && f->classes > img->classes)
    return rt_fail(e, "%s: %" PRId64 " classes (byte 24), more than the model's %" PRId64 " (the last dimension of the logits its "
                   "cross_entropy reads)",
                   path, f->classes, img->classes);
  if (f->count < 1) return rt_fail(e, "%s: no images (the count at byte 8 is 0)", path);
  L->first[L->nshards] = L->first[L->nshards - 1] + f->count;
  return 0;
}

static DataLoader *loader_open(const DataConfig *cfg, const DataImageSpec *img, RtErr *e) {
  int images = img != NULL;
  const char *what = images ? "image" : "token";
  if (!cfg->pattern || !*cfg->pattern) {
    rt_fail(e, "no %s data given (--data or the train block's data)", what);
    return NULL;
  }
  int64_t elems = 1;
  for (int i = 0; images && i < img->rank && i < DATA_IMAGE_MAX_RANK; i++)
    elems = img->dims[i] >= 1 && img->dims[i] <= ((int64_t)1 << 40) / elems ? elems * img->dims[i] : 0;
  if (cfg->batch < 1 || (!images && cfg->seq_len < 1) || (images && (img->rank < 1 || img->rank > DATA_IMAGE_MAX_RANK || elems < 1)) ||
      cfg->nranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->nranks || cfg->start < 0) {
    rt_fail(e, "data loader: bad configuration (batch %" PRId64 ", seq_len %" PRId64 ", image rank %d, rank %d of %d)", cfg->batch,
            cfg->seq_len, images ? img->rank : 0, cfg->rank, cfg->nranks);
    return NULL;
  }
  if ((images ? elems : cfg->seq_len) > ((int64_t)1 << 40) / cfg->batch) {
    rt_fail(e, "data loader: a micro-batch of %" PRId64 " x %" PRId64 " values is too large", cfg->batch, images ? elems : cfg->seq_len);
    return NULL;
  }
  DataLoader *L = rt_calloc(1, sizeof *L);
  if (!L) {
    rt_fail(e, "out of memory");
    return NULL;
  }
  L->cfg = *cfg;
  L->images = images;
  L->pattern = rt_strdup(cfg->pattern);
  L->cfg.pattern = L->pattern;
  int name_ok = 1;
  if (images) {
    L->img = *img;
    L->img_input = img->input ? rt_strdup(img->input) : NULL;
    L->img.input = L->img_input;
    name_ok = !img->input || L->img_input;
  }
  glob_t g;
  memset(&g, 0, sizeof g);
  int grc = glob(cfg->pattern, 0, NULL, &g); /* sorted: the order is the same on every rank */
  if (grc != 0 || g.gl_pathc == 0) {
    if (!has_glob_chars(cfg->pattern)) {
      struct stat st;
      if (stat(cfg->pattern, &st) < 0) rt_fail_errno(e, errno, "%s: cannot open the %s file", cfg->pattern, what);
      else rt_fail(e, "%s: cannot read the %s file", cfg->pattern, what);
    } else {
      rt_fail(e, "%s: no %s file matches", cfg->pattern, what);
    }
    globfree(&g);
    data_loader_close(L);
    return NULL;
  }
  if (images) L->imgs = rt_calloc(g.gl_pathc, sizeof *L->imgs);
  else L->shards = rt_calloc(g.gl_pathc, sizeof *L->shards);
  L->first = rt_calloc(g.gl_pathc + 1, sizeof *L->first);
  if (!L->pattern || !name_ok || !(images ? (void *)L->imgs : (void *)L->shards) || !L->first) {
    rt_fail(e, "out of memory");
    globfree(&g);
    data_loader_close(L);
    return NULL;
  }
  for (size_t i = 0; i < g.gl_pathc; i++)
    if (open_file(L, g.gl_pathv[i], e) < 0) {
      globfree(&g);
      data_loader_close(L);
      return NULL;
    }
  globfree(&g);
  L->windows = L->first[L->nshards];
  int64_t per = images ? elems : cfg->seq_len;
  for (int k = 0; k < 2; k++) {
    DataBatch *b = &L->slot[k].b;
    b->batch = cfg->batch;
    if (images) {
      b->image_elems = elems;
      b->images = rt_calloc((size_t)(cfg->batch * per), sizeof(float));
      b->labels = rt_calloc((size_t)cfg->batch, sizeof(int32_t));
    } else {
      b->seq_len = cfg->seq_len;
      b->inputs = rt_calloc((size_t)(cfg->batch * per), sizeof(int32_t));
      b->targets = rt_calloc((size_t)(cfg->batch * per), sizeof(int32_t));
    }
    if (images ? !b->images || !b->labels : !b->inputs || !b->targets) {
      rt_fail(e, "out of memory for the data loader's batches");
      data_loader_close(L);
      return NULL;
    }
  }
  if (cfg->prefetch) {
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv, NULL);
    L->state = PF_IDLE;
    if (pthread_create(&L->thread, NULL, prefetch_main, L) != 0) {
      pthread_mutex_destroy(&L->mu);
      pthread_cond_destroy(&L->cv);
    } else {
      L->threaded = 1; /* without the thread the loader still works, synchronously */
    }
  }
  return L;
}

DataLoader *data_loader_open(const DataConfig *cfg, RtErr *e) { return loader_open(cfg, NULL, e); }

DataLoader *data_loader_open_images(const DataConfig *cfg, const DataImageSpec *img, RtErr *e) {
  if (!img) {
    rt_fail(e, "data loader: no image specification");
    return NULL;
  }
  return loader_open(cfg, img, e);
}

void data_loader_seek(DataLoader *L, int64_t index) { L->next = index; }

const DataBatch *data_loader_next(DataLoader *L, RtErr *e) {
  int64_t j = L->next++;
  if (!L->threaded) {
    fill_slot(L, &L->slot[0], j);
  } else {
    pthread_mutex_lock(&L->mu);
    while (L->state == PF_WORKING) pthread_cond_wait(&L->cv, &L->mu);
    int have = L->state == PF_READY && L->slot[1].b.index == j;
    if (have) {
      Slot t = L->slot[0];
      L->slot[0] = L->slot[1];
      L->slot[1] = t;
    }
    L->state = PF_IDLE;
    pthread_mutex_unlock(&L->mu);
    if (!have) fill_slot(L, &L->slot[0], j); /* after a seek, or the first call */
    pthread_mutex_lock(&L->mu);
    L->want = j + 1;
    L->state = PF_WORKING;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
  }
  if (L->slot[0].err[0]) {
    rt_fail(e, "%s", L->slot[0].err);
    return NULL;
  }
  return &L->slot[0].b;
}

void data_loader_close(DataLoader *L) {
  if (!L) return;
  if (L->threaded) {
    pthread_mutex_lock(&L->mu);
    L->quit = 1;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    pthread_join(L->thread, NULL);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv);
  }
  for (int i = 0; i < L->nshards; i++) {
    if (L->images) data_images_close(&L->imgs[i]);
    else data_shard_close(&L->shards[i]);
  }
  for (int k = 0; k < 2; k++) {
    rt_free(L->slot[k].b.inputs);
    rt_free(L->slot[k].b.targets);
    rt_free(L->slot[k].b.images);
    rt_free(L->slot[k].b.labels);
  }
  rt_free(L->shards);
  rt_free(L->imgs);
  rt_free(L->img_input);
  rt_free(L->first);
  rt_free(L->pattern);
  rt_free(L);
}

/* ---- text to tokens ---- */

static int write_part(const unsigned char *text, int64_t len, const char *prefix, const char *split, int64_t per_shard,
                      int *nshards, FILE *log, RtErr *e) {
  uint32_t *tok = rt_calloc((size_t)(len < per_shard ? len : per_shard) + 1, sizeof *tok);
  if (!tok) return rt_fail(e, "out of memory");
  for (int64_t start = 0; start < len; start += per_shard) {
    int64_t n = len - start < per_shard ? len - start : per_shard;
    for (int64_t i = 0; i < n; i++) tok[i] = text[start + i];
    char path[4096];
    int w = snprintf(path, sizeof path, "%s_%s_%06d.bin", prefix, split, *nshards);
    if (w < 0 || (size_t)w >= sizeof path) {
      rt_free(tok);
      return rt_fail(e, "%s: output prefix too long", prefix);
    }
    if (data_shard_write(path, tok, n, 1, e) < 0) {
      rt_free(tok);
      return -1;
    }
    if (log) fprintf(log, "wrote %s (%" PRId64 " tokens)\n", path, n);
    (*nshards)++;
  }
  rt_free(tok);
  return 0;
}

int data_convert_bytes(const unsigned char *text, int64_t len, const char *prefix, const DataConvertOptions *opt,
                       DataConvertReport *rep, FILE *log, RtErr *e) {
  memset(rep, 0, sizeof *rep);
  double vf = opt->val_fraction;
  if (!(vf >= 0 && vf < 1)) return rt_fail(e, "the validation fraction must be in [0, 1), not %g", vf);
  int64_t per = opt->shard_tokens > 0 ? opt->shard_tokens : 100000000;
  if (per > INT32_MAX) return rt_fail(e, "at most %d tokens fit in one shard", INT32_MAX);
  int64_t nval = (int64_t)((double)len * vf + 0.5), ntrain = len - nval;
  if (ntrain < 2) return rt_fail(e, "the text has %" PRId64 " bytes: too little to train on", len);
  if (write_part(text, ntrain, prefix, "train", per, &rep->train_shards, log, e) < 0) return -1;
  if (write_part(text + ntrain, nval, prefix, "val", per, &rep->val_shards, log, e) < 0) return -1;
  rep->train_tokens = ntrain;
  rep->val_tokens = nval;
  return 0;
}

void data_synthetic_text(char *out, int64_t len, uint64_t seed) {
  static const char *const det[] = {"the", "a", "one", "every", "that"};
  static const char *const adj[] = {"small", "old", "quick", "quiet", "red", "happy", "tired", "clever"};
  static const char *const noun[] = {"cat", "dog", "bird", "child", "farmer", "robot", "teacher", "river", "tree", "ship"};
  static const char *const verb[] = {"sees", "likes", "follows", "helps", "finds", "watches", "carries", "hears"};
  static const char *const place[] = {"in the garden", "by the sea", "at night", "near the house", "on the hill", "after lunch"};
#define PICK(arr) arr[mix64(seed + ctr++) % (sizeof arr / sizeof arr[0])]
  uint64_t ctr = 0;
  int64_t n = 0;
  char sentence[256];
  while (n < len) {
    int w;
    uint64_t form = mix64(seed + ctr++) % 3;
    const char *d1 = PICK(det), *a1 = PICK(adj), *n1 = PICK(noun), *v = PICK(verb), *d2 = PICK(det), *n2 = PICK(noun);
    if (form == 0) w = snprintf(sentence, sizeof sentence, "%s %s %s %s %s %s. ", d1, a1, n1, v, d2, n2);
    else if (form == 1) w = snprintf(sentence, sizeof sentence, "%s %s %s %s %s. ", d1, n1, v, d2, n2);
    else w = snprintf(sentence, sizeof sentence, "%s %s %s %s %s %s. ", d1, n1, v, d2, n2, PICK(place));
    if (w > 0) sentence[0] = (char)(sentence[0] - 'a' + 'A');
    if (mix64(seed + ctr++) % 6 == 0 && w > 1) sentence[w - 1] = '\n';
    for (int i = 0; i < w && n < len; i++) out[n++] = sentence[i];
  }
#undef PICK
}

/* ---- synthetic images ---- */

/* A uniform double in [0, 1) from a counter-based stream. */
static double unit(uint64_t key, uint64_t *ctr) { return (double)(mix64(key + (*ctr)++) >> 11) * (1.0 / 9007199254740992.0); }

void data_synthetic_image(const DataSyntheticImages *o, int64_t i, unsigned char *record) {
  const double pi = 3.14159265358979323846;
  int64_t C = o->channels, H = o->height, W = o->width, K = o->classes;
  uint64_t key = mix64(o->seed ^ mix64((uint64_t)i + 0x51ED2701u)), ctr = 0;
  int64_t k = (int64_t)(mix64(key) % (uint64_t)K);
  ctr++;
  /* the class's colour: a hue of its own (a grey level of its own with one
   * channel), and its stripes: an orientation and a frequency */
  double hue = (double)k / (double)K;
  double theta = pi * (double)k / (double)K, freq = 2 * pi * (double)(2 + k % 3) / (double)(H > W ? H : W);
  double cx = (0.25 + 0.5 * unit(key, &ctr)) * (double)W, cy = (0.25 + 0.5 * unit(key, &ctr)) * (double)H;
  double sigma = 0.22 * (double)(H < W ? H : W) + 0.5, phase = 2 * pi * unit(key, &ctr);
  record[0] = (unsigned char)k;
  unsigned char *px = record + 1;
  for (int64_t c = 0; c < C; c++) {
    double tone = C == 1 ? 0.15 + 0.7 * (K > 1 ? (double)k / (double)(K - 1) : 0.5) : 0.5 + 0.45 * cos(2 * pi * (hue - (double)c / (double)C));
    for (int64_t y = 0; y < H; y++)
      for (int64_t x = 0; x < W; x++) {
        double dx = (double)x - cx, dy = (double)y - cy;
        double blob = exp(-(dx * dx + dy * dy) / (2 * sigma * sigma));
        double stripe = sin(freq * ((double)x * cos(theta) + (double)y * sin(theta)) + phase);
        double noise = 2 * unit(key, &ctr) - 1;
        double v = 0.2 + 0.25 * tone + 0.45 * blob * tone + 0.08 * stripe + 0.06 * noise;
        v = v < 0 ? 0 : v > 1 ? 1 : v;
        px[(c * H + y) * W + x] = (unsigned char)(v * 255 + 0.5);
      }
  }
}

static int write_images_part(const DataSyntheticImages *o, int64_t first, int64_t n, const char *prefix, const char *split,
                             int64_t per, int *nfiles, FILE *log, RtErr *e) {
  int64_t rec = 1 + o->channels * o->height * o->width;
  unsigned char *buf = rt_alloc((size_t)((n < per ? n : per) * rec) + 1);
  if (!buf) return rt_fail(e, "out of memory for %" PRId64 " images of %" PRId64 " bytes", n < per ? n : per, rec);
  for (int64_t start = 0; start < n; start += per) {
    int64_t m = n - start < per ? n - start : per;
    for (int64_t i = 0; i < m; i++) data_synthetic_image(o, first + start + i, buf + i * rec);
    char path[4096];
    int w = snprintf(path, sizeof path, "%s_%s_%06d.img", prefix, split, *nfiles);
    if (w < 0 || (size_t)w >= sizeof path) {
      rt_free(buf);
      return rt_fail(e, "%s: output prefix too long", prefix);
    }
    if (data_images_write(path, m, o->channels, o->height, o->width, o->classes, buf, e) < 0) {
      rt_free(buf);
      return -1;
    }
    if (log) fprintf(log, "wrote %s (%" PRId64 " images)\n", path, m);
    (*nfiles)++;
  }
  rt_free(buf);
  return 0;
}

int data_write_synthetic_images(const DataSyntheticImages *o, const char *prefix, DataImagesReport *rep, FILE *log, RtErr *e) {
  memset(rep, 0, sizeof *rep);
  if (o->classes < 2 || o->classes > DATA_IMAGE_MAX_CLASSES) return rt_fail(e, "%" PRId64 " classes: synthetic images have 2 to 256", o->classes);
  if (o->channels < 1 || o->height < 1 || o->width < 1 || o->channels > 4096 || o->height > 65536 || o->width > 65536 ||
      o->channels * o->height * o->width > ((int64_t)1 << 30))
    return rt_fail(e, "an image of %" PRId64 "x%" PRId64 "x%" PRId64 ": each dimension from 1, at most 2^30 pixels", o->channels, o->height,
                   o->width);
  double vf = o->val_fraction;
  if (!(vf >= 0 && vf < 1)) return rt_fail(e, "the validation fraction must be in [0, 1), not %g", vf);
  int64_t per = o->shard_images > 0 ? o->shard_images : 50000;
  if (per > INT32_MAX) return rt_fail(e, "at most %d images fit in one file", INT32_MAX);
  int64_t rec = 1 + o->channels * o->height * o->width;
  if (per > (((int64_t)1 << 34) / rec)) per = ((int64_t)1 << 34) / rec > 0 ? ((int64_t)1 << 34) / rec : 1; /* files of at most 16 GiB */
  int64_t nval = (int64_t)((double)o->count * vf + 0.5), ntrain = o->count - nval;
  if (ntrain < 1) return rt_fail(e, "%" PRId64 " images leave none to train on", o->count);
  if (write_images_part(o, 0, ntrain, prefix, "train", per, &rep->train_files, log, e) < 0) return -1;
  if (nval && write_images_part(o, ntrain, nval, prefix, "val", per, &rep->val_files, log, e) < 0) return -1;
  rep->train_images = ntrain;
  rep->val_images = nval;
  return 0;
}
