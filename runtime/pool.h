/* pool.h - a persistent pool of threads for the generated CPU kernels'
 * row loops (hpd_ctx.parallel, docs/runtime.md "Speed on the CPU").
 *
 * A step of a compiled model calls a few hundred short loops (softmax,
 * LayerNorm, cross-entropy, elementwise chains, gradient sums), each a
 * fraction of a millisecond to a few milliseconds: par.h's create / join
 * per call would cost as much as some of them take. The pool's workers
 * live as long as the program; between jobs each spins a little (the next
 * loop often follows within microseconds), then sleeps on a condition
 * variable, so that it leaves the core to the BLAS's threads during a GEMM.
 *
 * pool_run splits [0, n) into min(threads, n) contiguous ranges of sizes
 * that differ by at most one (par.h's split) and calls fn(ctx, lo, hi) once
 * per range, the first on the calling thread. Which thread runs a range
 * never changes what the range computes, so results do not depend on the
 * thread count as long as fn's ranges are independent. */
#ifndef HPDL_POOL_H
#define HPDL_POOL_H

#include <stdint.h>

typedef struct ThreadPool ThreadPool;

/* Returns 0 on success, non-zero on failure (pool_run returns the first
 * range's non-zero result in range order). */
typedef int (*PoolFn)(void *ctx, int64_t lo, int64_t hi);

/* A pool of nthreads threads, the caller's included (nthreads - 1 workers
 * are started). NULL when nthreads < 2 or no worker could start: callers
 * then run their loops inline. */
ThreadPool *pool_create(int nthreads);

/* The threads a job runs on (the caller's included). */
int pool_threads(const ThreadPool *p);

/* Runs fn over [0, n) as described above and returns when every range is
 * done. p NULL: fn(ctx, 0, n) inline. Not reentrant: one job at a time,
 * from one calling thread. */
int pool_run(ThreadPool *p, int64_t n, PoolFn fn, void *ctx);

void pool_destroy(ThreadPool *p);

#endif
