/* data.h - training data: llm.c-style .bin token shards, image files with
 * labels, and a deterministic, data-parallel, prefetching loader over
 * either (the format chosen by each file's magic).
 *
 * A shard is a 256 x int32 little-endian header, then the tokens:
 *   header[0] = 20240520 (magic), header[1] = version, header[2] = tokens
 *   version 1: uint16 tokens (GPT-2's vocabulary fits); version 2: uint32.
 * llm.c's Llama-3 shards (magic 20240801, version 7, uint32) are read too.
 *
 * Windows: a shard of n tokens holds (n - 1) / T windows of T + 1 tokens,
 * starting at multiples of T (llm.c's stride): inputs tokens[i .. i+T),
 * targets tokens[i+1 .. i+T+1). Windows never cross shards.
 *
 * Order: the windows of all shards (in sorted file-name order) are numbered
 * 0 .. W-1; epoch e visits them in a pseudo-random permutation seeded by
 * (seed, e) (or in order without shuffling). Position p of the endless
 * stream is window perm_e(p mod W) with e = p / W. Data-parallel rank r of n
 * takes positions r, r + n, r + 2n, ...; its micro-batch j is positions
 * start + (j*B + b)*n + r, b = 0..B-1. So step s of a run with dp*B*accum sequences
 * per step reads stream positions [s*dp*B*accum, (s+1)*dp*B*accum) whatever
 * the layout, and a micro-batch is found from its index alone: resuming is
 * seeking, and a run saved at dp=2 resumes at dp=1 reading the same data.
 *
 * Image files (docs/runtime.md, "Image data"): a 64-byte header of 16
 * little-endian int32,
 *   [0] = 20261127 (magic), [1] = version (1), [2] = N images,
 *   [3] = C channels, [4] = H height, [5] = W width, [6] = K classes,
 *   [7..15] = 0 (reserved),
 * then N records of 1 + C*H*W bytes: the label (a byte < K), then the
 * pixels, uint8, channel-major (CHW). A record is CIFAR-10's binary layout
 * (label byte + 3072 pixel bytes), so CIFAR's data_batch_*.bin files behind
 * this header are image files. A pixel p becomes the float p / 255 - 0.5.
 * An image is a window of the stream above: the order, the data-parallel
 * split and resuming are the same. */
#ifndef HPDL_DATA_H
#define HPDL_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rt.h"

enum {
  DATA_MAGIC = 20240520,
  DATA_MAGIC_LLAMA3 = 20240801, /* llm.c's uint32 shards, version 7 */
  DATA_HEADER_INTS = 256,
  DATA_HEADER_BYTES = 1024,
  DATA_IMAGE_MAGIC = 20261127,
  DATA_IMAGE_VERSION = 1,
  DATA_IMAGE_HEADER_INTS = 16,
  DATA_IMAGE_HEADER_BYTES = 64,
  DATA_IMAGE_MAX_CLASSES = 256, /* a label is one byte */
  DATA_IMAGE_MAX_RANK = 8,      /* a model's per-image dimensions */
};

/* One shard, mapped read-only. */
typedef struct {
  char *path;
  int version;
  int token_bytes; /* 2 or 4 */
  int64_t ntokens;
  const unsigned char *tokens; /* at byte 1024 of the mapping */
  void *map;        /* NULL for a shard read from memory (data_shard_open_mem) */
  size_t map_len;
} DataShard;

/* Opens and validates a shard: magic, version, header token count against
 * the file size. Errors name the file and the byte offset at fault. */
int data_shard_open(DataShard *s, const char *path, RtErr *e);
/* The same checks on a shard's bytes already in memory (`name` for the
 * messages); the tokens point into buf, which must outlive the shard. */
int data_shard_open_mem(DataShard *s, const char *name, const void *buf, size_t len, RtErr *e);
void data_shard_close(DataShard *s);

static inline uint32_t data_shard_token(const DataShard *s, int64_t i) {
  if (s->token_bytes == 2) {
    const unsigned char *p = s->tokens + 2 * i;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
  }
  const unsigned char *p = s->tokens + 4 * i;
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Writes a shard atomically (temporary file, fsync, rename). version 1
 * needs every token < 65536. */
int data_shard_write(const char *path, const uint32_t *tokens, int64_t n, int version, RtErr *e);

/* One image file, mapped read-only. */
typedef struct {
  char *path;
  int version;
  int64_t count;                    /* N */
  int64_t channels, height, width;  /* C, H, W */
  int64_t classes;                  /* K: every label is < K */
  int64_t record_bytes;             /* 1 + C*H*W */
  const unsigned char *records;     /* at byte 64 of the mapping */
  void *map;                        /* NULL for a file read from memory */
  size_t map_len;
} DataImages;

/* Opens and validates an image file: magic, version, dimensions, the
 * records against the file size (a truncated file names its first missing
 * record). Labels are checked as they are read (data_images_check_labels
 * checks them all). Errors name the file and the byte offset at fault. */
int data_images_open(DataImages *s, const char *path, RtErr *e);
int data_images_open_mem(DataImages *s, const char *name, const void *buf, size_t len, RtErr *e);
void data_images_close(DataImages *s);
/* Every label < K: 0, or -1 naming the first bad record and its byte.
 * counts (K entries, or NULL) gets the images of each class. */
int data_images_check_labels(const DataImages *s, int64_t *counts, RtErr *e);
/* Record i's label byte and its C*H*W pixels. */
static inline const unsigned char *data_images_record(const DataImages *s, int64_t i) { return s->records + i * s->record_bytes; }
/* Writes an image file atomically; records holds n records (label, then
 * C*H*W pixels), every label < classes. */
int data_images_write(const char *path, int64_t n, int64_t channels, int64_t height, int64_t width, int64_t classes,
                      const unsigned char *records, RtErr *e);
/* The float a pixel becomes: p / 255 - 0.5, in [-0.5, 0.5]. */
static inline float data_pixel(unsigned char p) { return (float)p / 255.0f - 0.5f; }
/* Whether a model's per-image dimensions (the input's after the batch)
 * take a file's [C, H, W]: equal once leading 1s are dropped from both
 * ([1, 28, 28] is [28, 28]), or flat ([C*H*W]). */
int data_image_shape_fits(const int64_t *dims, int rank, int64_t c, int64_t h, int64_t w);
/* The magic of a file (its first 4 bytes) in *magic: 0, or -1 when it
 * cannot be read (no message: the format's own open says why). */
int data_file_magic(const char *path, int32_t *magic);

typedef struct {
  const char *pattern;  /* a path or a glob ("data/train_*.bin") */
  int64_t batch;        /* B: sequences per micro-batch on this rank */
  int64_t seq_len;      /* T */
  int rank, nranks;     /* data-parallel rank and group size */
  uint64_t seed;
  int shuffle;          /* 0: windows in file order */
  int prefetch;         /* 1: a thread prepares the next micro-batch */
  int64_t vocab;        /* > 0: a token >= vocab is an error */
  int64_t start;        /* stream position of micro-batch 0 (sequences already
                           consumed, when resuming) */
} DataConfig;

/* What an image model takes (data_loader_open_images): the files must be
 * image files whose [C, H, W] its per-image dimensions take
 * (data_image_shape_fits), with at most `classes` classes (when > 0). */
typedef struct {
  int rank;                          /* the image input's dimensions after the batch */
  int64_t dims[DATA_IMAGE_MAX_RANK];
  int64_t classes;
  const char *input;                 /* its name, for messages (may be NULL) */
} DataImageSpec;

typedef struct {
  int64_t batch, seq_len;
  int32_t *inputs;  /* B x T, row-major */
  int32_t *targets; /* B x T */
  int64_t index;    /* this rank's micro-batch number */
  int64_t epoch;    /* the epoch of its first window */
  /* Image data (inputs and targets NULL, seq_len 0); after the token
   * fields, where a program built before them does not look. */
  float *images;        /* B x C x H x W, pixel / 255 - 0.5 */
  int32_t *labels;      /* B */
  int64_t image_elems;  /* C x H x W */
} DataBatch;

typedef struct DataLoader DataLoader;

/* Token windows from token shards. */
DataLoader *data_loader_open(const DataConfig *cfg, RtErr *e);
/* Images and labels from image files (cfg's seq_len and vocab unused). */
DataLoader *data_loader_open_images(const DataConfig *cfg, const DataImageSpec *img, RtErr *e);
void data_loader_close(DataLoader *L);
int64_t data_loader_windows(const DataLoader *L); /* W (images, for image files) */
int data_loader_nshards(const DataLoader *L);     /* files, of either kind */
const DataShard *data_loader_shard(const DataLoader *L, int i); /* NULL for image files */
const DataImages *data_loader_images(const DataLoader *L, int i); /* NULL for token shards */
/* The next micro-batch is number `index` (for resuming). */
void data_loader_seek(DataLoader *L, int64_t index);
/* The next micro-batch; valid until the following call. NULL with a message
 * (e.g. a token outside the vocabulary, naming file and offset). */
const DataBatch *data_loader_next(DataLoader *L, RtErr *e);
/* Micro-batch `index` of this rank, computed directly (no prefetch). */
int data_loader_fill(const DataLoader *L, int64_t index, int32_t *inputs, int32_t *targets, RtErr *e);
/* The same for image files: B x C*H*W floats and B labels. */
int data_loader_fill_images(const DataLoader *L, int64_t index, float *images, int32_t *labels, RtErr *e);
/* Where stream position p lies: shard and first token of its window (for
 * image files: file and record). */
void data_loader_locate(const DataLoader *L, int64_t pos, int *shard, int64_t *offset);

/* A bijection of [0, n) chosen by key: a 4-round Feistel network on the
 * smallest even number of bits covering n, cycle-walking back into range
 * (Black and Rogaway 2002), so no table of n entries is needed. */
int64_t data_permute(int64_t i, int64_t n, uint64_t key);

/* ---- text to tokens ---- */

typedef struct {
  double val_fraction;  /* the tail of the text that becomes validation data */
  int64_t shard_tokens; /* at most this many tokens per shard (0: 100M) */
} DataConvertOptions;

typedef struct {
  int64_t train_tokens, val_tokens;
  int train_shards, val_shards;
} DataConvertReport;

/* Byte-level tokenisation (token = byte value, vocabulary 256) of `len`
 * bytes into PREFIX_train_NNNNNN.bin and PREFIX_val_NNNNNN.bin (version 1).
 * The validation part is the last val_fraction of the bytes. Every shard
 * is written atomically; `log` (may be NULL) gets one line per file. */
int data_convert_bytes(const unsigned char *text, int64_t len, const char *prefix, const DataConvertOptions *opt,
                       DataConvertReport *rep, FILE *log, RtErr *e);

/* Deterministic English-like text for demos and tests (no downloads): short
 * sentences from a small grammar, with enough structure that a model's loss
 * visibly falls. Writes exactly len bytes into out. */
void data_synthetic_text(char *out, int64_t len, uint64_t seed);

/* ---- synthetic images ---- */

typedef struct {
  int64_t count;                   /* images in all */
  int64_t channels, height, width; /* default 3 x 32 x 32 */
  int64_t classes;                 /* 2 .. 256, default 10 */
  uint64_t seed;
  double val_fraction;             /* the last images become validation data */
  int64_t shard_images;            /* at most this many per file (0: 50000) */
} DataSyntheticImages;

typedef struct {
  int64_t train_images, val_images;
  int train_files, val_files;
} DataImagesReport;

/* Record i of the synthetic set (label, then C*H*W pixels): each class a
 * colour and a stripe pattern of its own, a soft blob of the colour at a
 * random position over a faint tint of it, plus noise, so that a small MLP
 * tells them apart within tens of steps. Depends only on (seed, i). */
void data_synthetic_image(const DataSyntheticImages *o, int64_t i, unsigned char *record);
/* PREFIX_train_NNNNNN.img and PREFIX_val_NNNNNN.img, each atomic; `log`
 * (may be NULL) gets one line per file. */
int data_write_synthetic_images(const DataSyntheticImages *o, const char *prefix, DataImagesReport *rep, FILE *log, RtErr *e);

#endif
