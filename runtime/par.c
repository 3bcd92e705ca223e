/* par.c - see par.h. */
#define _GNU_SOURCE /* sched_yield, clock_gettime */
#include "par.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* More threads than this are not worth a step's creation cost (the pool's bound too). */
#define PAR_MAX_THREADS 256

/* Range j of k over [0, n): [j n / k, (j + 1) n / k), sizes differ by at most one. */
static void range_of(int64_t n, int k, int j, int64_t *lo, int64_t *hi) {
  *lo = n / k * j + (n % k) * j / k;
  *hi = n / k * (j + 1) + (n % k) * (j + 1) / k;
}

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
  for (int j = 0; j < k; j++) {
    r[j] = (ParRange){fn, ctx, 0, 0};
    range_of(n, k, j, &r[j].lo, &r[j].hi);
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

/* ---- the persistent pool ---- */

/* How long an idle worker spins for the next job before it sleeps, in
 * microseconds (HPDL_POOL_SPIN_US overrides it, for measurements). Row
 * loops between two GEMMs follow each other within a few microseconds;
 * a GEMM takes a millisecond or more, during which a spinning worker would
 * take a core from the BLAS's threads. */
enum { PAR_POOL_SPIN_US_DEFAULT = 50 };

typedef struct {
  ParPool *pool;
  int index; /* 1 .. threads - 1: the range it runs */
  pthread_t tid;
} ParPoolWorker;

struct ParPool {
  int threads;  /* the caller and the workers */
  int nworkers; /* started */
  int64_t spin_ns;
  ParPoolWorker *workers;
  /* the job: written by the caller before `generation` moves on */
  ParPoolFn fn;
  void *ctx;
  int64_t n;
  int ranges;
  int rc[PAR_MAX_THREADS];
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

/* Waits until the generation differs from `seen`: polls spin_ns, yielding
 * the core to any other runnable thread between polls (the caller running a
 * kernel alone, the BLAS's threads), then sleeps. */
static unsigned wait_job(ParPool *p, unsigned seen) {
  unsigned g;
  int64_t until = now_ns() + p->spin_ns;
  for (int i = 0;; i++) {
    g = atomic_load_explicit(&p->generation, memory_order_acquire);
    if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
    sched_yield();
    if ((i & 7) == 7 && now_ns() > until) break;
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
  ParPoolWorker *w = arg;
  ParPool *p = w->pool;
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

ParPool *par_pool_create(int nthreads) {
  if (nthreads < 2) return NULL;
  if (nthreads > PAR_MAX_THREADS) nthreads = PAR_MAX_THREADS;
  ParPool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->workers = calloc((size_t)nthreads, sizeof *p->workers);
  if (!p->workers) {
    free(p);
    return NULL;
  }
  const char *s = getenv("HPDL_POOL_SPIN_US");
  long us = s && *s ? strtol(s, NULL, 10) : PAR_POOL_SPIN_US_DEFAULT;
  p->spin_ns = (us < 0 ? 0 : us) * 1000;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  atomic_init(&p->generation, 0);
  atomic_init(&p->done, 0);
  atomic_init(&p->stop, 0);
  for (int j = 1; j < nthreads; j++) {
    ParPoolWorker *w = &p->workers[p->nworkers];
    w->pool = p;
    w->index = p->nworkers + 1;
    if (pthread_create(&w->tid, NULL, worker_main, w) != 0) break;
    p->nworkers++;
  }
  if (!p->nworkers) {
    par_pool_destroy(p);
    return NULL;
  }
  p->threads = p->nworkers + 1;
  return p;
}

int par_pool_threads(const ParPool *p) { return p ? p->threads : 1; }

int par_pool_run(ParPool *p, int64_t n, ParPoolFn fn, void *ctx) {
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

void par_pool_destroy(ParPool *p) {
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
