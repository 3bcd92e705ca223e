/* blas_bench.c - a BLAS's cblas_sgemm on the GEMMs of a GPT-2 small step.
 *
 *   blas_bench LIBRARY.so
 *
 * Opens LIBRARY (dlopen), times cblas_sgemm (row-major) on the twelve
 * products of samples/gpt2.hpd at B = 4, T = 64 (256 rows): a block's four
 * forward products, its backward's input and weight gradients, the LM head
 * forward and both its gradients, and 1024^3 for reference; the best of
 * three calls each. Prints GFLOP/s per shape and over the step's mix (each
 * block product 12 times, the head's once). The thread count is the
 * library's own variable (OPENBLAS_NUM_THREADS, BLIS_NUM_THREADS). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*Sgemm)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                      const float *b, int ldb, float beta, float *c, int ldc);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: blas_bench LIBRARY.so\n");
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  Sgemm sgemm = lib ? (Sgemm)dlsym(lib, "cblas_sgemm") : NULL;
  if (!sgemm) {
    fprintf(stderr, "blas_bench: %s: %s\n", argv[1], lib ? "no cblas_sgemm" : dlerror());
    return 1;
  }
  static const struct {
    int m, n, k, ta, tb, per_step;
    const char *what;
  } shapes[] = {
      {256, 2304, 768, 0, 0, 12, "qkv"},         {256, 768, 768, 0, 0, 12, "attention out"},
      {256, 3072, 768, 0, 0, 12, "mlp up"},      {256, 768, 3072, 0, 0, 12, "mlp down"},
      {256, 768, 2304, 0, 1, 12, "qkv dx"},      {768, 2304, 256, 1, 0, 12, "qkv dW"},
      {256, 3072, 768, 0, 1, 12, "mlp down dx"}, {768, 3072, 256, 1, 0, 12, "mlp up dW"},
      {256, 50257, 768, 0, 1, 1, "head"},        {256, 768, 50257, 0, 0, 1, "head dx"},
      {50257, 768, 256, 1, 0, 1, "head dW"},     {1024, 1024, 1024, 0, 0, 0, "1024^3"},
  };
  size_t big = (size_t)50257 * 768 + 4096;
  float *a = malloc(big * sizeof(float)), *b = malloc(big * sizeof(float)), *c = malloc(big * sizeof(float));
  if (!a || !b || !c) return 1;
  for (size_t i = 0; i < big; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f, c[i] = 0;
  double mix_s = 0, mix_flops = 0;
  printf("%s\n", argv[1]);
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int m = shapes[s].m, n = shapes[s].n, k = shapes[s].k, ta = shapes[s].ta, tb = shapes[s].tb;
    int lda = ta ? m : k, ldb = tb ? k : n;
    double best = 1e30;
    for (int r = 0; r < 4; r++) { /* the first call warms up */
      double t0 = now();
      sgemm(ROW_MAJOR, ta ? TRANS : NO_TRANS, tb ? TRANS : NO_TRANS, m, n, k, 1, a, lda, b, ldb, 0, c, n);
      double t = now() - t0;
      if (r && t < best) best = t;
    }
    double flops = 2.0 * m * n * k;
    mix_s += best * shapes[s].per_step, mix_flops += flops * shapes[s].per_step;
    printf("  %-14s %6d x %6d x %6d %c%c  %7.1f GFLOP/s\n", shapes[s].what, m, n, k, ta ? 't' : 'n', tb ? 't' : 'n',
           flops / best / 1e9);
  }
  printf("  the step's mix: %.1f GFLOP/s\n", mix_flops / mix_s / 1e9);
  return 0;
}
