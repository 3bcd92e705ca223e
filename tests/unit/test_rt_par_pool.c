/* test_rt_par_pool.c - the kernels' thread pool (runtime/par.c, par_pool_*): every index
 * of [0, n) in exactly one range for any n and thread count, the ranges
 * par_for would make, over thousands of jobs back to back (workers
 * spinning) and with pauses between them (workers asleep), with and
 * without a spin; the first failing range's status in range order; no
 * pool (one thread) runs the job inline. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, setenv */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "par.h"
#include "test_util.h"

typedef struct {
  atomic_int *hits;
  atomic_int calls, bad;
  int64_t n;
  int64_t fail_from; /* ranges starting at or after this return lo + 1 */
} Cover;

static int cover_range(void *ctx, int64_t lo, int64_t hi) {
  Cover *c = ctx;
  atomic_fetch_add(&c->calls, 1);
  if (lo < 0 || hi > c->n || lo >= hi) {
    atomic_fetch_add(&c->bad, 1);
    return 0;
  }
  for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&c->hits[i], 1);
  return lo >= c->fail_from ? (int)lo + 1 : 0;
}

/* One job: every index once, min(threads, n) ranges, the expected status. */
static void one_job(ParPool *p, int64_t n, int64_t fail_from) {
  Cover c = {.hits = calloc((size_t)n + 1, sizeof(atomic_int)), .n = n, .fail_from = fail_from};
  int rc = par_pool_run(p, n, cover_range, &c);
  int once = 1;
  for (int64_t i = 0; i < n; i++) once &= atomic_load(&c.hits[i]) == 1;
  EXPECT(once);
  EXPECT(atomic_load(&c.bad) == 0);
  int64_t k = par_pool_threads(p) < n ? par_pool_threads(p) : n;
  EXPECT(atomic_load(&c.calls) == (n > 0 ? k : 0));
  /* the first failing range in range order: the one starting at the least lo >= fail_from */
  int want = 0;
  for (int64_t j = 0; j < k && !want; j++) {
    int64_t lo = n / k * j + (n % k) * j / k;
    if (lo >= fail_from) want = (int)lo + 1;
  }
  EXPECT(rc == want);
  free(c.hits);
}

static void pause_us(long us) {
  struct timespec t = {0, us * 1000};
  nanosleep(&t, NULL);
}

static void test_pool(int threads) {
  ParPool *p = par_pool_create(threads);
  EXPECT(threads < 2 ? p == NULL : p != NULL);
  EXPECT(par_pool_threads(p) == (threads < 2 ? 1 : threads));
  const int64_t ns[] = {0, 1, 2, 3, 5, 7, 64, 1000, 4097};
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
    one_job(p, ns[a], INT64_MAX);
    one_job(p, ns[a], 0);
    one_job(p, ns[a], ns[a] / 2);
  }
  for (int j = 0; j < 3000; j++) one_job(p, 1 + j % 37, INT64_MAX); /* back to back */
  for (int j = 0; j < 20; j++) {                                    /* workers gone to sleep */
    pause_us(j % 2 ? 200 : 2000);
    one_job(p, 100 + j, j % 3 ? INT64_MAX : 50);
  }
  par_pool_destroy(p);
}

int main(void) {
  for (int t = 0; t <= 5; t++) test_pool(t);
  setenv("HPDL_POOL_SPIN_US", "0", 1); /* straight to sleep after each job */
  for (int t = 2; t <= 3; t++) test_pool(t);
  par_pool_destroy(NULL);
  TEST_DONE();
}
