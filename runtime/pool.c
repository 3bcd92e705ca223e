/* pool.c - see pool.h. */
#define _GNU_SOURCE /* sched_yield */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

enum { POOL_MAX_THREADS = 256 };

/* How long an idle worker spins for the next job before it sleeps, in
 * microseconds (HPDL_POOL_SPIN_US overrides it, for measurements). Row
 * loops between two GEMMs follow each other within a few microseconds;
 * a GEMM takes a millisecond or more, during which a spinning worker would
 * take a core from the BLAS's threads. */
enum { POOL_SPIN_US_DEFAULT = 50 };

typedef struct {
  ThreadPool *pool;
  int index; /* 1 .. threads - 1: the range it runs */
  pthread_t tid;
} PoolWorker;

struct ThreadPool {
  int threads;  /* the caller and the workers */
  int nworkers; /* started */
  int64_t spin_ns;
  PoolWorker *workers;
  /* the job: written by the caller before `generation` moves on */
  PoolFn fn;
  void *ctx;
  int64_t n;
  int ranges;
  int rc[POOL_MAX_THREADS];
  atomic_uint generation; /* bumped once per job */
  atomic_int done;        /* workers finished with the current job */
  atomic_int stop;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  int sleepers; /* under mu */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Range j of k over [0, n): [j n / k, (j + 1) n / k), sizes differ by at most one. */
static void range_of(int64_t n, int k, int j, int64_t *lo, int64_t *hi) {
  *lo = n / k * j + (n % k) * j / k;
  *hi = n / k * (j + 1) + (n % k) * (j + 1) / k;
}

/* Waits until the generation differs from `seen`: spins spin_ns, then sleeps. */
static unsigned wait_job(ThreadPool *p, unsigned seen) {
  unsigned g;
  int64_t until = now_ns() + p->spin_ns;
  for (int i = 0;; i++) {
    g = atomic_load_explicit(&p->generation, memory_order_acquire);
    if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
    cpu_relax();
    if ((i & 63) == 63 && now_ns() > until) break;
  }
  pthread_mutex_lock(&p->mu);
  p->sleepers++;
  while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
         !atomic_load_explicit(&p->stop, memory_order_relaxed))
    pthread_cond_wait(&p->wake, &p->mu);
  p->sleepers--;
  pthread_mutex_unlock(&p->mu);
  return g;
}

static void *worker_main(void *arg) {
  PoolWorker *w = arg;
  ThreadPool *p = w->pool;
  /* the generation before any job: a worker that starts after the first
   * job was posted must still see it as new */
  unsigned seen = 0;
  for (;;) {
    seen = wait_job(p, seen);
    if (atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
    if (w->index < p->ranges) {
      int64_t lo, hi;
      range_of(p->n, p->ranges, w->index, &lo, &hi);
      p->rc[w->index] = p->fn(p->ctx, lo, hi);
    }
    atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
  }
  return NULL;
}

ThreadPool *pool_create(int nthreads) {
  if (nthreads < 2) return NULL;
  if (nthreads > POOL_MAX_THREADS) nthreads = POOL_MAX_THREADS;
  ThreadPool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->workers = calloc((size_t)nthreads, sizeof *p->workers);
  if (!p->workers) {
    free(p);
    return NULL;
  }
  const char *s = getenv("HPDL_POOL_SPIN_US");
  long us = s && *s ? strtol(s, NULL, 10) : POOL_SPIN_US_DEFAULT;
  p->spin_ns = (us < 0 ? 0 : us) * 1000;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  atomic_init(&p->generation, 0);
  atomic_init(&p->done, 0);
  atomic_init(&p->stop, 0);
  for (int j = 1; j < nthreads; j++) {
    PoolWorker *w = &p->workers[p->nworkers];
    w->pool = p;
    w->index = p->nworkers + 1;
    if (pthread_create(&w->tid, NULL, worker_main, w) != 0) break;
    p->nworkers++;
  }
  if (!p->nworkers) {
    pool_destroy(p);
    return NULL;
  }
  p->threads = p->nworkers + 1;
  return p;
}

int pool_threads(const ThreadPool *p) { return p ? p->threads : 1; }

int pool_run(ThreadPool *p, int64_t n, PoolFn fn, void *ctx) {
  if (n <= 0) return 0;
  int k = p ? p->threads : 1;
  if ((int64_t)k > n) k = (int)n;
  if (k == 1) return fn(ctx, 0, n);
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  p->ranges = k;
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  /* the release publishes the job; the mutex orders it with a sleeper's check */
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
  if (p->sleepers) pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  int64_t lo, hi;
  range_of(n, k, 0, &lo, &hi);
  p->rc[0] = fn(ctx, lo, hi);
  /* the workers' ranges: spin, then yield the core to them (a machine with
   * more threads than cores) */
  for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < p->nworkers; i++) {
    if (i < 4096) cpu_relax();
    else sched_yield();
  }
  for (int j = 0; j < k; j++)
    if (p->rc[j]) return p->rc[j];
  return 0;
}

void pool_destroy(ThreadPool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  atomic_fetch_add(&p->generation, 1);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int j = 0; j < p->nworkers; j++) pthread_join(p->workers[j].tid, NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  free(p->workers);
  free(p);
}
