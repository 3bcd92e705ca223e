/* init.c - the per-logical-tensor generator (a copy of interp.c's). */
#include "init.h"

#include <math.h>
#include <string.h>

static const char *const kind_names[] = {"zeros", "ones", "constant", "normal", "uniform"};

int init_kind_parse(const char *name) {
  for (int i = 0; i < 5; i++)
    if (!strcmp(name, kind_names[i])) return i;
  return -1;
}

const char *init_kind_name(InitKindRt k) { return (unsigned)k < 5 ? kind_names[k] : "?"; }

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t init_hash_name(uint64_t seed, const char *name, int64_t layer) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ull;
  }
  uint64_t s = seed ^ h;
  uint64_t a = splitmix64(&s);
  s = a ^ ((uint64_t)layer * 0xD1B54A32D192ED03ull);
  return splitmix64(&s);
}

double init_uniform01(uint64_t *state) { return (double)(splitmix64(state) >> 11) * 0x1.0p-53; }

/* Box-Muller, one value per call, as interp_normal. */
double init_normal(uint64_t *state) {
  double u1 = 1.0 - init_uniform01(state);
  double u2 = init_uniform01(state);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static double next_value(const InitSpec *s, uint64_t *st) {
  switch (s->kind) {
  case INIT_K_ZEROS: return 0;
  case INIT_K_ONES: return 1;
  case INIT_K_CONSTANT: return s->a;
  case INIT_K_NORMAL: return s->a + s->b * init_normal(st);
  case INIT_K_UNIFORM: return s->a + (s->b - s->a) * init_uniform01(st);
  }
  return 0;
}

void init_fill_f64(double *out, int64_t numel, const InitSpec *s, uint64_t seed, const char *name, int64_t layer) {
  uint64_t st = init_hash_name(seed, name, layer);
  for (int64_t k = 0; k < numel; k++) out[k] = next_value(s, &st);
}

/* splitmix64's state moves by the same constant at every draw, so the
 * state before value k of a stream is st0 + draws x k x that constant: any
 * range of a tensor is drawn without the values before it (counter-based),
 * and a shard or a thread's part costs its own values only. */
#define SPLITMIX_GAMMA 0x9E3779B97F4A7C15ull

static uint64_t draws_per_value(InitKindRt k) { return k == INIT_K_NORMAL ? 2 : k == INIT_K_UNIFORM ? 1 : 0; }

void init_fill_f32_range(float *out, int64_t first, int64_t n, const InitSpec *s, uint64_t st0) {
  uint64_t st = st0 + draws_per_value(s->kind) * (uint64_t)first * SPLITMIX_GAMMA;
  for (int64_t k = 0; k < n; k++) out[k] = (float)next_value(s, &st);
}

typedef struct {
  float *out;
  const InitSpec *s;
  uint64_t st0;
} FillCtx;

static void fill_run(void *ctx, int64_t local_at, int64_t logical_at, int64_t n) {
  const FillCtx *f = ctx;
  init_fill_f32_range(f->out + local_at, logical_at, n, f->s, f->st0);
}

void init_fill_f32_shard_part(float *out, int rank, const int64_t *dims, const ShardSplit *split, const InitSpec *s,
                              uint64_t seed, const char *name, int64_t layer, int64_t from, int64_t to) {
  FillCtx f = {out, s, init_hash_name(seed, name, layer)};
  shard_runs(rank, dims, split, from, to, fill_run, &f);
}

void init_fill_f32_shard(float *out, int rank, const int64_t *dims, const ShardSplit *split, const InitSpec *s,
                         uint64_t seed, const char *name, int64_t layer) {
  init_fill_f32_shard_part(out, rank, dims, split, s, seed, name, layer, 0, shard_numel(rank, dims, split));
}
