/* data.h - token data: llm.c-style .bin shards and a deterministic,
 * data-parallel, prefetching loader over them.
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
 * seeking, and a run saved at dp=2 resumes at dp=1 reading the same data. */
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

typedef struct {
  int64_t batch, seq_len;
  int32_t *inputs;  /* B x T, row-major */
  int32_t *targets; /* B x T */
  int64_t index;    /* this rank's micro-batch number */
  int64_t epoch;    /* the epoch of its first window */
} DataBatch;

typedef struct DataLoader DataLoader;

DataLoader *data_loader_open(const DataConfig *cfg, RtErr *e);
void data_loader_close(DataLoader *L);
int64_t data_loader_windows(const DataLoader *L); /* W */
int data_loader_nshards(const DataLoader *L);
const DataShard *data_loader_shard(const DataLoader *L, int i);
/* The next micro-batch is number `index` (for resuming). */
void data_loader_seek(DataLoader *L, int64_t index);
/* The next micro-batch; valid until the following call. NULL with a message
 * (e.g. a token outside the vocabulary, naming file and offset). */
const DataBatch *data_loader_next(DataLoader *L, RtErr *e);
/* Micro-batch `index` of this rank, computed directly (no prefetch). */
int data_loader_fill(const DataLoader *L, int64_t index, int32_t *inputs, int32_t *targets, RtErr *e);
/* Where stream position p lies: shard and first token of its window. */
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

#endif
