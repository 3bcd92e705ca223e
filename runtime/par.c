/* par.c - see par.h. */
#include "par.h"

#include <pthread.h>
#include <string.h>

typedef struct {
  ParFn fn;
  void *ctx;
  int64_t lo, hi;
} ParRange;

static void *par_run(void *arg) {
  ParRange *r = arg;
  r->fn(r->ctx, r->lo, r->hi);
  return NULL;
}

/* More threads than this are not worth a step's creation cost. */
#define PAR_MAX_THREADS 256

void par_for(int nthreads, int64_t n, ParFn fn, void *ctx) {
  if (n <= 0) return;
  int k = nthreads < 1 ? 1 : nthreads > PAR_MAX_THREADS ? PAR_MAX_THREADS : nthreads;
  if ((int64_t)k > n) k = (int)n;
  if (k == 1) {
    fn(ctx, 0, n);
    return;
  }
  ParRange r[PAR_MAX_THREADS];
  pthread_t tid[PAR_MAX_THREADS];
  int started[PAR_MAX_THREADS] = {0};
  /* Range j: [j n / k, (j + 1) n / k), sizes differ by at most one. */
  for (int j = 0; j < k; j++) {
    r[j] = (ParRange){fn, ctx, n / k * j + (n % k) * j / k, n / k * (j + 1) + (n % k) * (j + 1) / k};
  }
  for (int j = 1; j < k; j++) started[j] = pthread_create(&tid[j], NULL, par_run, &r[j]) == 0;
  par_run(&r[0]);
  /* A range whose thread could not start runs here: slower, never wrong. */
  for (int j = 1; j < k; j++) {
    if (started[j]) pthread_join(tid[j], NULL);
    else par_run(&r[j]);
  }
}

int par_threads_for(int nthreads, int64_t n) {
  return n < PAR_MIN_ELEMS || nthreads < 1 ? 1 : nthreads;
}

enum { PAR_PAGE = 4096 };

static void touch_pages(void *ctx, int64_t lo, int64_t hi) {
  volatile unsigned char *b = ctx;
  for (int64_t i = lo; i < hi; i++) b[i * PAR_PAGE] = 0;
}

void par_prefault(int nthreads, void *p, size_t bytes) {
  if (!p || !bytes) return;
  int64_t pages = (int64_t)((bytes + PAR_PAGE - 1) / PAR_PAGE);
  /* the last page's first byte lies inside the block: pages - 1 full pages before it */
  par_for(pages >= 256 ? nthreads : 1, pages, touch_pages, p);
}

static void zero_range(void *ctx, int64_t lo, int64_t hi) { memset((float *)ctx + lo, 0, (size_t)(hi - lo) * sizeof(float)); }

void par_zero_f32(int nthreads, float *p, int64_t n) {
  if (!p || n <= 0) return;
  par_for(par_threads_for(nthreads, n), n, zero_range, p);
}
