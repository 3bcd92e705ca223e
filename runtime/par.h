/* par.h - a tiny fork-join loop over plain pthreads, for the runtime's
 * per-step passes outside the program (gradient norm, clipping, the
 * optimizer update), which would otherwise run on one of the rank's threads.
 *
 * par_for splits [0, n) into at most nthreads contiguous ranges and calls
 * fn(ctx, lo, hi) once per range, the first on the calling thread; it
 * returns when all are done. With one range it calls fn inline and creates
 * no thread. Each call creates and joins its threads (a few tens of
 * microseconds), so callers go parallel only above PAR_MIN_ELEMS. */
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

#endif
