/* data.c - token shards, the window order, the prefetching loader, and the
 * text converter. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
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

int data_shard_open(DataShard *s, const char *path, RtErr *e) {
  memset(s, 0, sizeof *s);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return rt_fail_errno(e, errno, "%s: cannot open the token file", path);
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int err = errno;
    close(fd);
    return rt_fail_errno(e, err, "%s: cannot stat", path);
  }
  int64_t size = (int64_t)st.st_size;
  unsigned char hdr[DATA_HEADER_BYTES];
  if (size < DATA_HEADER_BYTES) {
    close(fd);
    return too_short(path, size, e);
  }
  ssize_t got = pread(fd, hdr, sizeof hdr, 0);
  if (got != (ssize_t)sizeof hdr) {
    int err = errno;
    close(fd);
    return rt_fail_errno(e, got < 0 ? err : EIO, "%s: cannot read the header", path);
  }
  int version = 0, tb = 0;
  int32_t count = 0;
  if (check_header(path, hdr, size, &version, &tb, &count, e) < 0) {
    close(fd);
    return -1;
  }
  s->path = rt_strdup(path);
  if (!s->path) {
    close(fd);
    return rt_fail(e, "%s: out of memory", path);
  }
  s->map_len = (size_t)size;
  s->map = mmap(NULL, s->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  close(fd);
  if (s->map == MAP_FAILED) {
    s->map = NULL;
    rt_free(s->path);
    s->path = NULL;
    return rt_fail_errno(e, err, "%s: cannot map the file", path);
  }
  s->version = version;
  s->token_bytes = tb;
  s->ntokens = count;
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
  char *pattern;
  DataShard *shards;
  int nshards;
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
const DataShard *data_loader_shard(const DataLoader *L, int i) { return &L->shards[i]; }

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
  *offset = (w - L->first[lo]) * L->cfg.seq_len;
}

int data_loader_fill(const DataLoader *L, int64_t index, int32_t *inputs, int32_t *targets, RtErr *e) {
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

static void fill_slot(DataLoader *L, Slot *s, int64_t index) {
  RtErr e;
  s->err[0] = 0;
  s->b.index = index;
  s->b.epoch = (L->cfg.start + index * L->cfg.batch * L->cfg.nranks + L->cfg.rank) / L->windows;
  if (data_loader_fill(L, index, s->b.inputs, s->b.targets, &e) < 0) memcpy(s->err, e.msg, sizeof s->err);
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

DataLoader *data_loader_open(const DataConfig *cfg, RtErr *e) {
  if (!cfg->pattern || !*cfg->pattern) {
    rt_fail(e, "no token data given (--data or the train block's data)");
    return NULL;
  }
  if (cfg->batch < 1 || cfg->seq_len < 1 || cfg->nranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->nranks || cfg->start < 0) {
    rt_fail(e, "data loader: bad configuration (batch %" PRId64 ", seq_len %" PRId64 ", rank %d of %d)", cfg->batch, cfg->seq_len,
            cfg->rank, cfg->nranks);
    return NULL;
  }
  DataLoader *L = rt_calloc(1, sizeof *L);
  if (!L) {
    rt_fail(e, "out of memory");
    return NULL;
  }
  L->cfg = *cfg;
  L->pattern = rt_strdup(cfg->pattern);
  L->cfg.pattern = L->pattern;
  glob_t g;
  memset(&g, 0, sizeof g);
  int grc = glob(cfg->pattern, 0, NULL, &g); /* sorted: the order is the same on every rank */
  if (grc != 0 || g.gl_pathc == 0) {
    if (!has_glob_chars(cfg->pattern)) {
      struct stat st;
      if (stat(cfg->pattern, &st) < 0) rt_fail_errno(e, errno, "%s: cannot open the token file", cfg->pattern);
      else rt_fail(e, "%s: cannot read the token file", cfg->pattern);
    } else {
      rt_fail(e, "%s: no token file matches", cfg->pattern);
    }
    globfree(&g);
    data_loader_close(L);
    return NULL;
  }
  L->shards = rt_calloc(g.gl_pathc, sizeof *L->shards);
  L->first = rt_calloc(g.gl_pathc + 1, sizeof *L->first);
  if (!L->pattern || !L->shards || !L->first) {
    rt_fail(e, "out of memory");
    globfree(&g);
    data_loader_close(L);
    return NULL;
  }
  for (size_t i = 0; i < g.gl_pathc; i++) {
    if (data_shard_open(&L->shards[i], g.gl_pathv[i], e) < 0) {
      globfree(&g);
      data_loader_close(L);
      return NULL;
    }
    L->nshards++;
    const DataShard *s = &L->shards[i];
    if (s->ntokens < cfg->seq_len + 1) {
      rt_fail(e, "%s: %" PRId64 " tokens (the count at byte 8), fewer than the %" PRId64 " (sequence length + 1) one window needs",
              s->path, s->ntokens, cfg->seq_len + 1);
      globfree(&g);
      data_loader_close(L);
      return NULL;
    }
    L->first[i + 1] = L->first[i] + (s->ntokens - 1) / cfg->seq_len;
  }
  globfree(&g);
  L->windows = L->first[L->nshards];
  for (int k = 0; k < 2; k++) {
    L->slot[k].b.batch = cfg->batch;
    L->slot[k].b.seq_len = cfg->seq_len;
    L->slot[k].b.inputs = rt_calloc((size_t)(cfg->batch * cfg->seq_len), sizeof(int32_t));
    L->slot[k].b.targets = rt_calloc((size_t)(cfg->batch * cfg->seq_len), sizeof(int32_t));
    if (!L->slot[k].b.inputs || !L->slot[k].b.targets) {
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
  for (int i = 0; i < L->nshards; i++) data_shard_close(&L->shards[i]);
  for (int k = 0; k < 2; k++) {
    rt_free(L->slot[k].b.inputs);
    rt_free(L->slot[k].b.targets);
  }
  rt_free(L->shards);
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
