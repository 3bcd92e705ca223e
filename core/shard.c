/* shard.c - a rank's piece of a logical tensor (see shard.h). */
#include "shard.h"

#include <stdio.h>
#include <string.h>

/* The piece as a box: lo[i] .. lo[i] + len[i] along each axis. */
static int shard_box(int rank, const int64_t *dims, const ShardSplit *s, int64_t *lo, int64_t *len, char *why, int whylen) {
  for (int i = 0; i < rank; i++) lo[i] = 0, len[i] = dims[i];
  const int cuts[2][3] = {{s->axis, s->parts, s->index}, {s->axis2, s->parts2, s->index2}};
  for (int k = 0; k < 2; k++) {
    int axis = cuts[k][0], parts = cuts[k][1], index = cuts[k][2];
    if (parts <= 1) continue;
    if (axis < 0 || axis >= rank) {
      if (why) snprintf(why, (size_t)whylen, "split axis %d of a rank-%d tensor", axis, rank);
      return -1;
    }
    if (len[axis] % parts) {
      if (why) snprintf(why, (size_t)whylen, "dimension %d (%lld) does not divide into %d parts", axis, (long long)len[axis], parts);
      return -1;
    }
    if (index < 0 || index >= parts) {
      if (why) snprintf(why, (size_t)whylen, "piece %d of %d", index, parts);
      return -1;
    }
    len[axis] /= parts;
    lo[axis] += len[axis] * index;
  }
  return 0;
}

int shard_dims(int rank, const int64_t *dims, const ShardSplit *s, int64_t *local, char *why, int whylen) {
  int64_t lo[SHARD_MAX_RANK];
  return shard_box(rank, dims, s, lo, local, why, whylen);
}

int64_t shard_numel(int rank, const int64_t *dims, const ShardSplit *s) {
  int64_t lo[SHARD_MAX_RANK], len[SHARD_MAX_RANK], n = 1;
  if (shard_box(rank, dims, s, lo, len, NULL, 0) < 0) return 0;
  for (int i = 0; i < rank; i++) n *= len[i];
  return n;
}

void shard_runs(int rank, const int64_t *dims, const ShardSplit *s, int64_t from, int64_t to, ShardRunFn fn, void *ctx) {
  int64_t lo[SHARD_MAX_RANK], len[SHARD_MAX_RANK];
  if (from >= to || shard_box(rank, dims, s, lo, len, NULL, 0) < 0) return;
  /* The trailing axes the piece holds whole make one run, with the first
   * axis before them that is cut (or any). */
  int64_t run = 1;
  int inner = rank; /* axes inner.. are whole */
  while (inner > 0 && len[inner - 1] == dims[inner - 1]) run *= dims[--inner];
  if (inner > 0) run *= len[--inner]; /* axis `inner` is cut (or the outermost) */
  if (run <= 0) return;
  /* logical stride of each axis */
  int64_t stride[SHARD_MAX_RANK];
  int64_t st = 1;
  for (int i = rank - 1; i >= 0; i--) stride[i] = st, st *= dims[i];
  for (int64_t j = from; j < to;) {
    int64_t r = j / run, off = j % run, n = run - off < to - j ? run - off : to - j;
    /* r indexes the outer axes 0..inner-1 of the piece, row-major */
    int64_t at = 0;
    for (int i = inner - 1; i >= 0; i--) {
      at += (lo[i] + r % len[i]) * stride[i];
      r /= len[i];
    }
    if (inner < rank) at += lo[inner] * stride[inner];
    fn(ctx, j, at + off, n);
    j += n;
  }
}

typedef struct {
  unsigned char *logical, *local;
  int esize, to_logical;
} CopyCtx;

static void copy_run(void *ctx, int64_t local_at, int64_t logical_at, int64_t n) {
  const CopyCtx *c = ctx;
  unsigned char *g = c->logical + logical_at * c->esize, *l = c->local + local_at * c->esize;
  if (c->to_logical) memcpy(g, l, (size_t)(n * c->esize));
  else memcpy(l, g, (size_t)(n * c->esize));
}

void shard_extract(const void *logical, int esize, int rank, const int64_t *dims, const ShardSplit *s, void *local) {
  CopyCtx c = {(unsigned char *)(uintptr_t)logical, local, esize, 0};
  shard_runs(rank, dims, s, 0, shard_numel(rank, dims, s), copy_run, &c);
}

void shard_insert(void *logical, int esize, int rank, const int64_t *dims, const ShardSplit *s, const void *local) {
  CopyCtx c = {logical, (unsigned char *)(uintptr_t)local, esize, 1};
  shard_runs(rank, dims, s, 0, shard_numel(rank, dims, s), copy_run, &c);
}
