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

void init_fill_f32_shard(float *out, int rank, const int64_t *dims, int axis, int parts, int index, const InitSpec *s,
                         uint64_t seed, const char *name, int64_t layer) {
  int64_t outer = 1, inner = 1, len = 1;
  if (axis >= 0 && axis < rank && parts > 1) {
    for (int i = 0; i < axis; i++) outer *= dims[i];
    for (int i = axis + 1; i < rank; i++) inner *= dims[i];
    len = dims[axis];
  } else {
    for (int i = 0; i < rank; i++) inner *= dims[i];
    parts = 1;
    index = 0;
  }
  /* Walk the whole logical stream (every value costs the same draws, so
   * skipping ahead would need the same work) and keep our piece. */
  int64_t piece = len / parts, lo = piece * index, hi = lo + piece;
  uint64_t st = init_hash_name(seed, name, layer);
  float *o = out;
  for (int64_t a = 0; a < outer; a++)
    for (int64_t l = 0; l < len; l++)
      for (int64_t i = 0; i < inner; i++) {
        double v = next_value(s, &st);
        if (l >= lo && l < hi) *o++ = (float)v;
      }
}
