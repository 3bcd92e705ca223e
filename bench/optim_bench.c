/* optim_bench.c - how long the runtime's per-step passes outside the program
 * take (train.c: gradient sum of squares, clipping scale, AdamW update) on
 * GPT-2 124M-sized arrays, for 1 .. N threads (optim_*_mt, par.h; there the
 * clipping scale is applied inside the update's pass: its own column is 0),
 * and the update with the moments in bf16 (train.moments = bf16,
 * optim_adamw16_mt: 12 bytes a value moved instead of 20).
 *
 *   optim_bench [MAX_THREADS] [RUNS] [N_VALUES]
 *
 * Built by `cmake --build BUILD --target optim_bench`. Not a test: timings
 * depend on the machine and on what else runs on its cores. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "optim.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  int max_threads = argc > 1 ? atoi(argv[1]) : 2, runs = argc > 2 ? atoi(argv[2]) : 5;
  int64_t n = argc > 3 ? atoll(argv[3]) : 124439808; /* GPT-2 124M, tied embeddings */
  if (max_threads < 1 || runs < 1 || n < 1) {
    fprintf(stderr, "usage: optim_bench [MAX_THREADS >= 1] [RUNS >= 1] [N_VALUES >= 1]\n");
    return 2;
  }
  float *p = malloc((size_t)n * sizeof *p), *g = malloc((size_t)n * sizeof *g);
  float *m = calloc((size_t)n, sizeof *m), *v = calloc((size_t)n, sizeof *v);
  uint16_t *m16 = calloc((size_t)n, sizeof *m16), *v16 = calloc((size_t)n, sizeof *v16);
  if (!p || !g || !m || !v || !m16 || !v16) {
    fprintf(stderr, "optim_bench: no memory for 4 x %lld floats\n", (long long)n);
    return 1;
  }
  for (int64_t i = 0; i < n; i++) {
    p[i] = 0.02f * (float)((i * 7919) % 1000 - 500) / 500.0f;
    g[i] = 1e-3f * (float)((i * 104729) % 1000 - 500) / 500.0f;
  }
  OptimConfig c;
  optim_defaults(&c);
  printf("optim_bench: %lld values, best of %d runs\n", (long long)n, runs);
  /* k = 0: the one-thread loops of optim.c (what train.c ran before par.h). */
  for (int k = 0; k <= max_threads; k++) {
    double best_sq = 1e30, best_sc = 1e30, best_ad = 1e30, best_16 = 1e30, sum = 0;
    for (int r = 0; r < runs; r++) {
      double t0 = now();
      sum = k ? optim_sumsq_mt(k, g, n) : optim_sumsq(g, n);
      double t1 = now();
      if (!k) optim_scale(g, n, 0.999); /* the threaded update takes the scale in its own pass */
      double t2 = now();
      if (k) optim_adamw_mt(k, p, g, m, v, n, r + 1, 3e-4, 0.1, &c, 0.999, NULL);
      else optim_adamw(p, g, m, v, n, r + 1, 3e-4, 0.1, &c);
      double t3 = now();
      if (k) optim_adamw16_mt(k, p, g, m16, v16, n, r + 1, 3e-4, 0.1, &c, 0.999, NULL);
      double t4 = now();
      if (k && t4 - t3 < best_16) best_16 = t4 - t3;
      if (t1 - t0 < best_sq) best_sq = t1 - t0;
      if (t2 - t1 < best_sc) best_sc = t2 - t1;
      if (t3 - t2 < best_ad) best_ad = t3 - t2;
    }
    if (k == 0) printf("  sequential ");
    else printf("  %d thread%s:", k, k == 1 ? " " : "s");
    printf(" sumsq %.1f ms, scale %.1f ms, adamw %.1f ms, total %.1f ms (sumsq %.6g)", 1e3 * best_sq, 1e3 * best_sc, 1e3 * best_ad,
           1e3 * (best_sq + best_sc + best_ad), sum);
    if (k) printf("; adamw with bf16 moments %.1f ms", 1e3 * best_16);
    printf("\n");
  }
  free(p);
  free(g);
  free(m);
  free(v);
  free(m16);
  free(v16);
  return 0;
}
