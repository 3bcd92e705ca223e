/* test_init.c - the counter-based initialiser (core/init.c): a shard, and
 * any part of one filled on its own, holds the same bits as walking the
 * tensor's whole stream from its start and keeping the shard's values (the
 * sequential walk is written again here, from init_normal and
 * init_uniform01, independently of the skip-ahead); init_fill_f64 (the
 * reference executor's) rounds to the same floats. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "init.h"
#include "test_util.h"

/* The walk the runtime did before: every value of the logical tensor in
 * row-major order, those of piece `index` along `axis` kept. */
static void walk(float *out, int rank, const int64_t *dims, int axis, int parts, int index, const InitSpec *s, uint64_t seed,
                 const char *name, int64_t layer) {
  int64_t outer = 1, inner = 1, len = 1;
  if (axis >= 0 && parts > 1) {
    for (int i = 0; i < axis; i++) outer *= dims[i];
    for (int i = axis + 1; i < rank; i++) inner *= dims[i];
    len = dims[axis];
  } else {
    for (int i = 0; i < rank; i++) inner *= dims[i];
    parts = 1;
    index = 0;
  }
  int64_t piece = len / parts, lo = piece * index, hi = lo + piece;
  uint64_t st = init_hash_name(seed, name, layer);
  for (int64_t a = 0; a < outer; a++)
    for (int64_t l = 0; l < len; l++)
      for (int64_t i = 0; i < inner; i++) {
        double v = s->kind == INIT_K_NORMAL    ? s->a + s->b * init_normal(&st)
                   : s->kind == INIT_K_UNIFORM ? s->a + (s->b - s->a) * init_uniform01(&st)
                   : s->kind == INIT_K_ONES    ? 1
                   : s->kind == INIT_K_CONSTANT ? s->a
                                                : 0;
        if (l >= lo && l < hi) *out++ = (float)v;
      }
}

static void test_shards_and_parts(void) {
  const int64_t shapes[][3] = {{12, 8, 6}, {1, 64, 1}, {7, 1, 16}, {4, 4, 4}};
  const InitSpec specs[] = {{INIT_K_NORMAL, 0.0, 0.02}, {INIT_K_UNIFORM, -0.5, 0.5}, {INIT_K_ONES, 0, 0}, {INIT_K_CONSTANT, 3.5, 0}};
  uint64_t rng = 99;
  int checked = 0;
  for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
    for (size_t sp = 0; sp < sizeof specs / sizeof *specs; sp++)
      for (int axis = -1; axis < 3; axis++)
        for (int parts = 1; parts <= 4; parts *= 2) {
          if (axis >= 0 && shapes[sh][axis] % parts) continue;
          for (int index = 0; index < parts; index++) {
            int64_t n = init_shard_numel(3, shapes[sh], axis, parts);
            float *want = calloc((size_t)n + 1, sizeof(float)), *got = calloc((size_t)n + 1, sizeof(float));
            walk(want, 3, shapes[sh], axis, parts, index, &specs[sp], 1337, "blocks.{i}.w", 5);
            init_fill_f32_shard(got, 3, shapes[sh], axis, parts, index, &specs[sp], 1337, "blocks.{i}.w", 5);
            EXPECT(memcmp(got, want, (size_t)n * sizeof(float)) == 0);
            /* the shard again in random parts, as threads fill it */
            memset(got, 0xff, (size_t)n * sizeof(float));
            for (int64_t from = 0; from < n;) {
              rng = rng * 6364136223846793005ull + 1442695040888963407ull;
              int64_t to = from + 1 + (int64_t)((rng >> 33) % (uint64_t)(n / 3 + 1));
              if (to > n) to = n;
              init_fill_f32_shard_part(got, 3, shapes[sh], axis, parts, index, &specs[sp], 1337, "blocks.{i}.w", 5, from, to);
              from = to;
            }
            EXPECT(memcmp(got, want, (size_t)n * sizeof(float)) == 0);
            free(want);
            free(got);
            checked++;
          }
        }
  EXPECT(checked > 200);
}

static void test_f64_rounds_to_the_same(void) {
  const int64_t dims[2] = {33, 17};
  InitSpec s = {INIT_K_NORMAL, 0.1, 0.5};
  double ref[33 * 17];
  float got[33 * 17];
  init_fill_f64(ref, 33 * 17, &s, 7, "wte.weight", 0);
  init_fill_f32_shard(got, 2, dims, -1, 1, 0, &s, 7, "wte.weight", 0);
  int same = 1;
  for (int i = 0; i < 33 * 17; i++) same &= got[i] == (float)ref[i];
  EXPECT(same);
  /* a range from the middle of the stream: value 100 onwards */
  float mid[50];
  init_fill_f32_range(mid, 100, 50, &s, init_hash_name(7, "wte.weight", 0));
  EXPECT(memcmp(mid, got + 100, sizeof mid) == 0);
  /* another layer's copy is another stream */
  float other[33 * 17];
  init_fill_f32_shard(other, 2, dims, -1, 1, 0, &s, 7, "wte.weight", 1);
  EXPECT(memcmp(other, got, sizeof other) != 0);
}

int main(void) {
  test_shards_and_parts();
  test_f64_rounds_to_the_same();
  TEST_DONE();
}
