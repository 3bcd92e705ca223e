/* test_init.c - the counter-based initialiser (core/init.c): a shard, and
 * any part of one filled on its own, holds the same bits as walking the
 * tensor's whole stream from its start and keeping the shard's values (the
 * sequential walk is written again here, from init_normal and
 * init_uniform01, independently of the skip-ahead), for pieces split once
 * or twice (core/shard.h); init_fill_f64 (the
 * reference executor's) rounds to the same floats. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "init.h"
#include "test_util.h"

/* The walk the runtime did before: every value of the logical tensor
 * (rank 3) in row-major order, those inside the piece's box kept (the box
 * found here from the split, independently of core/shard.c). */
static void walk(float *out, const int64_t *dims, const ShardSplit *sp, const InitSpec *s, uint64_t seed, const char *name,
                 int64_t layer) {
  int64_t lo[3] = {0, 0, 0}, hi[3] = {dims[0], dims[1], dims[2]};
  if (sp->parts > 1) {
    int64_t piece = dims[sp->axis] / sp->parts;
    lo[sp->axis] = piece * sp->index, hi[sp->axis] = lo[sp->axis] + piece;
  }
  if (sp->parts2 > 1) {
    int64_t piece = (hi[sp->axis2] - lo[sp->axis2]) / sp->parts2;
    lo[sp->axis2] += piece * sp->index2, hi[sp->axis2] = lo[sp->axis2] + piece;
  }
  uint64_t st = init_hash_name(seed, name, layer);
  for (int64_t i0 = 0; i0 < dims[0]; i0++)
    for (int64_t i1 = 0; i1 < dims[1]; i1++)
      for (int64_t i2 = 0; i2 < dims[2]; i2++) {
        double v = s->kind == INIT_K_NORMAL    ? s->a + s->b * init_normal(&st)
                   : s->kind == INIT_K_UNIFORM ? s->a + (s->b - s->a) * init_uniform01(&st)
                   : s->kind == INIT_K_ONES    ? 1
                   : s->kind == INIT_K_CONSTANT ? s->a
                                                : 0;
        if (i0 >= lo[0] && i0 < hi[0] && i1 >= lo[1] && i1 < hi[1] && i2 >= lo[2] && i2 < hi[2]) *out++ = (float)v;
      }
}

/* One piece: whole, in random parts (as threads fill it), and through
 * shard_extract of the whole tensor. */
static int check_piece(const int64_t *dims, const ShardSplit *sp, const InitSpec *spec, uint64_t *rng) {
  int64_t n = shard_numel(3, dims, sp);
  float *want = calloc((size_t)n + 1, sizeof(float)), *got = calloc((size_t)n + 1, sizeof(float));
  walk(want, dims, sp, spec, 1337, "blocks.{i}.w", 5);
  init_fill_f32_shard(got, 3, dims, sp, spec, 1337, "blocks.{i}.w", 5);
  int ok = memcmp(got, want, (size_t)n * sizeof(float)) == 0;
  memset(got, 0xff, (size_t)n * sizeof(float));
  for (int64_t from = 0; from < n;) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    int64_t to = from + 1 + (int64_t)((*rng >> 33) % (uint64_t)(n / 3 + 1));
    if (to > n) to = n;
    init_fill_f32_shard_part(got, 3, dims, sp, spec, 1337, "blocks.{i}.w", 5, from, to);
    from = to;
  }
  ok &= memcmp(got, want, (size_t)n * sizeof(float)) == 0;
  int64_t total = dims[0] * dims[1] * dims[2];
  float *whole = calloc((size_t)total, sizeof(float));
  ShardSplit all = shard_whole();
  init_fill_f32_shard(whole, 3, dims, &all, spec, 1337, "blocks.{i}.w", 5);
  shard_extract(whole, 4, 3, dims, sp, got);
  ok &= memcmp(got, want, (size_t)n * sizeof(float)) == 0;
  free(whole);
  free(want);
  free(got);
  return ok;
}

static void test_shards_and_parts(void) {
  const int64_t shapes[][3] = {{12, 8, 6}, {1, 64, 1}, {7, 1, 16}, {4, 4, 4}};
  const InitSpec specs[] = {{INIT_K_NORMAL, 0.0, 0.02}, {INIT_K_UNIFORM, -0.5, 0.5}, {INIT_K_ONES, 0, 0}, {INIT_K_CONSTANT, 3.5, 0}};
  uint64_t rng = 99;
  int checked = 0, twice = 0;
  for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
    for (size_t sp = 0; sp < sizeof specs / sizeof *specs; sp++)
      for (int axis = -1; axis < 3; axis++)
        for (int parts = 1; parts <= 4; parts *= 2) {
          if (axis >= 0 && shapes[sh][axis] % parts) continue;
          for (int index = 0; index < parts; index++) {
            ShardSplit one = {axis, axis >= 0 ? parts : 1, axis >= 0 ? index : 0, -1, 1, 0};
            EXPECT(check_piece(shapes[sh], &one, &specs[sp], &rng));
            checked++;
            /* then split again along another axis (an expert shard's block) */
            if (axis < 0 || parts == 1) continue;
            for (int axis2 = 0; axis2 < 3; axis2++) {
              if (axis2 == axis || shapes[sh][axis2] % 2) continue;
              for (int index2 = 0; index2 < 2; index2++) {
                ShardSplit two = {axis, parts, index, axis2, 2, index2};
                EXPECT(check_piece(shapes[sh], &two, &specs[sp], &rng));
                twice++;
              }
            }
          }
        }
  EXPECT(checked > 200);
  EXPECT(twice > 100);
}

static void test_f64_rounds_to_the_same(void) {
  const int64_t dims[2] = {33, 17};
  InitSpec s = {INIT_K_NORMAL, 0.1, 0.5};
  double ref[33 * 17];
  float got[33 * 17];
  init_fill_f64(ref, 33 * 17, &s, 7, "wte.weight", 0);
  ShardSplit whole = shard_whole();
  init_fill_f32_shard(got, 2, dims, &whole, &s, 7, "wte.weight", 0);
  int same = 1;
  for (int i = 0; i < 33 * 17; i++) same &= got[i] == (float)ref[i];
  EXPECT(same);
  /* a range from the middle of the stream: value 100 onwards */
  float mid[50];
  init_fill_f32_range(mid, 100, 50, &s, init_hash_name(7, "wte.weight", 0));
  EXPECT(memcmp(mid, got + 100, sizeof mid) == 0);
  /* another layer's copy is another stream */
  float other[33 * 17];
  init_fill_f32_shard(other, 2, dims, &whole, &s, 7, "wte.weight", 1);
  EXPECT(memcmp(other, got, sizeof other) != 0);
}

/* init_normal is Box-Muller with core/init.c's own logarithm and cosine:
 * within 1e-11 of the C library's transform of the same two draws over a
 * million values (the tails included: u1 down to 2^-20 appears), and the
 * sample's moments those of N(0, 1). A wrong polynomial coefficient, a
 * reduction step off by a quadrant or a lost sign shows in either. */
static void test_normal_against_libm(void) {
  uint64_t a = 42, b = 42;
  double worst = 0, m1 = 0, m2 = 0, m4 = 0, lo = 1;
  const int n = 1000000;
  for (int i = 0; i < n; i++) {
    double z = init_normal(&a);
    double u1 = 1.0 - init_uniform01(&b), u2 = init_uniform01(&b);
    double ref = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2), d = fabs(z - ref);
    if (d > worst) worst = d;
    if (u1 < lo) lo = u1;
    m1 += z, m2 += z * z, m4 += z * z * z * z;
  }
  m1 /= n, m2 /= n, m4 /= n;
  EXPECT(worst <= 1e-11);
  EXPECT(lo < 1e-5);
  EXPECT(fabs(m1) < 5e-3 && fabs(m2 - 1) < 5e-3 && fabs(m4 / (m2 * m2) - 3) < 3e-2);
}

int main(void) {
  test_normal_against_libm();
  test_shards_and_parts();
  test_f64_rounds_to_the_same();
  TEST_DONE();
}
