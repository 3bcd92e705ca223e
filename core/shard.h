/* shard.h - a rank's piece of a logical (row-major) tensor.
 *
 * A parameter is split along one axis into equal contiguous parts (over the
 * tensor, context or expert group), or along two: an expert shard under
 * tensor parallelism holds E / ep experts (axis 0, over the expert group)
 * and of each expert's matrix a column or row block (over the tensor group).
 * This is the partitioner's convention (compiler/parallel/spmd.c,
 * local_param); initialisation, checkpoints and the simulator find a
 * piece's values with it. */
#ifndef HPDL_SHARD_H
#define HPDL_SHARD_H

#include <stdint.h>

enum { SHARD_MAX_RANK = 8 };

/* Along `axis` into `parts` pieces, piece `index`; then that piece along
 * axis2 into parts2, piece index2. parts (parts2) <= 1: no such split. */
typedef struct {
  int axis, parts, index;
  int axis2, parts2, index2;
} ShardSplit;

static inline ShardSplit shard_whole(void) {
  ShardSplit s = {-1, 1, 0, -1, 1, 0};
  return s;
}

/* The piece's shape in local; -1 with a message in why (when not NULL)
 * when an axis does not divide or an index is out of range. */
int shard_dims(int rank, const int64_t *dims, const ShardSplit *s, int64_t *local, char *why, int whylen);
int64_t shard_numel(int rank, const int64_t *dims, const ShardSplit *s);

/* The piece's values [from, to), in its own row-major order, as runs
 * contiguous in both: fn(ctx, local offset, logical offset, length). */
typedef void (*ShardRunFn)(void *ctx, int64_t local_at, int64_t logical_at, int64_t n);
void shard_runs(int rank, const int64_t *dims, const ShardSplit *s, int64_t from, int64_t to, ShardRunFn fn, void *ctx);

/* Copies the piece out of the logical tensor, or into it; esize bytes a value. */
void shard_extract(const void *logical, int esize, int rank, const int64_t *dims, const ShardSplit *s, void *local);
void shard_insert(void *logical, int esize, int rank, const int64_t *dims, const ShardSplit *s, const void *local);

#endif
