/* par.h - a tiny fork-join loop over plain pthreads, for the runtime's
 * per-step passes outside the program (gradient norm, clipping, the
 * optimizer update), which would otherwise run on one of the rank's threads.
 *
 * par_for splits [0, n) into at most nthreads contiguous ranges and calls
 * fn(ctx, lo, hi) once per range, the first on the calling thread; it
 * returns when all are done. With one range it calls fn inline and creates
 * no thread. Each call creates and joins its threads (a few tens of
 * microseconds), so callers go parallel only above PAR_MIN_ELEMS.
 *
 * par_pool_* keep threads for the program's many short loops instead
 * (below). */
#ifndef HPDL_PAR_H
#define HPDL_PAR_H

#include <stddef.h>
#include <stdint.h>

/* Below this many elements a pass runs on one thread. */
#define PAR_MIN_ELEMS ((int64_t)1 << 16)

typedef void (*ParFn)(void *ctx, int64_t lo, int64_t hi);

void par_for(int nthreads, int64_t n, ParFn fn, void *ctx);

/* The threads for a pass over n elements: 1 below PAR_MIN_ELEMS. */
int par_threads_for(int nthreads, int64_t n);

/* Touches every page of the zeroed block [p, p + bytes) (writes a zero to
 * it) on up to nthreads threads: a fresh mapping's page faults, paid at
 * start-up on every thread instead of inside the first step on one. */
void par_prefault(int nthreads, void *p, size_t bytes);

/* p[0 .. n) = 0 on up to nthreads threads (the per-step gradient reset). */
void par_zero_f32(int nthreads, float *p, int64_t n);

/* ---- a persistent pool ----
 * Threads for the generated CPU kernels' row loops and the attention host
 * op's items (hpd_ctx.parallel, docs/runtime.md "Speed on the CPU").
 *
 * A step of a compiled model calls a few hundred short loops (softmax,
 * LayerNorm, cross-entropy, elementwise chains, gradient sums), each a
 * fraction of a millisecond to a few milliseconds: par.h's create / join
 * per call would cost as much as some of them take. The pool's workers
 * live as long as the program; between jobs each polls a little (the next
 * loop often follows within microseconds), yielding the core between
 * polls, then sleeps on a condition variable, so that it leaves the core to
 * the BLAS's threads during a GEMM.
 *
 * par_pool_run splits [0, n) into min(threads, n) contiguous ranges of sizes
 * that differ by at most one (par_for's split) and calls fn(ctx, lo, hi) once
 * per range, the first on the calling thread. Which thread runs a range
 * never changes what the range computes, so results do not depend on the
 * thread count as long as fn's ranges are independent. */
typedef struct ParPool ParPool;

/* Returns 0 on success, non-zero on failure (par_pool_run returns the first
 * range's non-zero result in range order). */
typedef int (*ParPoolFn)(void *ctx, int64_t lo, int64_t hi);

/* A pool of nthreads threads, the caller's included (nthreads - 1 workers
 * are started). NULL when nthreads < 2 or no worker could start: callers
 * then run their loops inline. */
ParPool *par_pool_create(int nthreads);

/* The threads a job runs on (the caller's included). */
int par_pool_threads(const ParPool *p);

/* Runs fn over [0, n) as described above and returns when every range is
 * done. p NULL: fn(ctx, 0, n) inline. Not reentrant: one job at a time,
 * from one calling thread. */
int par_pool_run(ParPool *p, int64_t n, ParPoolFn fn, void *ctx);

void par_pool_destroy(ParPool *p);

#endif
