/* init.h - deterministic parameter initialisation, identical for every
 * layout.
 *
 * Each logical tensor (and each layer's copy of a repeated one) draws its
 * values from its own generator, seeded by (seed, template name, layer
 * index), in row-major order of the logical tensor. The generator is
 * counter-based (value k's draws are found without the ones before it), so
 * a rank holding a shard, or a thread filling part of one, draws just its
 * values of the same stream: dp=1 and tp=8 start from the same weights, and those are the reference executor's: core/interp.c
 * calls these functions (the compiler library compiles this file), so the
 * two cannot drift apart; libhpdlrt does not carry the compiler. */
#ifndef HPDL_INIT_H
#define HPDL_INIT_H

#include <stdint.h>

#include "shard.h"

/* The kinds of semtypes.h's InitKind, in its order. */
typedef enum { INIT_K_ZEROS, INIT_K_ONES, INIT_K_CONSTANT, INIT_K_NORMAL, INIT_K_UNIFORM } InitKindRt;

typedef struct {
  InitKindRt kind;
  double a, b; /* constant: a; normal: mean a, std b; uniform: [a, b) */
} InitSpec;

/* "zeros", "ones", "constant", "normal", "uniform"; -1 when unknown. */
int init_kind_parse(const char *name);
const char *init_kind_name(InitKindRt k);

/* The generator (splitmix64, FNV-1a of the name; as interp_hash_name). */
uint64_t init_hash_name(uint64_t seed, const char *name, int64_t layer);
double init_uniform01(uint64_t *state);
double init_normal(uint64_t *state);

/* The values of a whole logical tensor (numel values) as doubles. */
void init_fill_f64(double *out, int64_t numel, const InitSpec *s, uint64_t seed, const char *name, int64_t layer);

/* A shard of a logical tensor (shard.h), in fp32, each value rounded from
 * the double the reference computes. */
void init_fill_f32_shard(float *out, int rank, const int64_t *dims, const ShardSplit *split, const InitSpec *s,
                         uint64_t seed, const char *name, int64_t layer);

/* Values [first, first + n) of the logical stream whose generator starts
 * at st0 (init_hash_name), in fp32: the same bits as walking the stream
 * from its start. */
void init_fill_f32_range(float *out, int64_t first, int64_t n, const InitSpec *s, uint64_t st0);

/* The part [from, to) of a shard's values (shard_numel of them), written to
 * out[from..to): threads fill a shard together, bit for bit as one. */
void init_fill_f32_shard_part(float *out, int rank, const int64_t *dims, const ShardSplit *split, const InitSpec *s,
                              uint64_t seed, const char *name, int64_t layer, int64_t from, int64_t to);

#endif
