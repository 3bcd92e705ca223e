/* prof.h - hpdlrun --profile: a rank's timeline in memory, and the Chrome
 * trace (docs/runtime.md, "Profiling") made from every rank's.
 *
 * A rank records spans (begin, end, on a track, with what is known of
 * them: bytes, FLOPs, the micro-batch, the chunk, the group and peer of a
 * message) into a buffer of at most `cap` events; past it events are
 * counted as dropped, not kept. Names are interned: a span's name is copied
 * once. prof_pack turns the buffer into one block of bytes that travels to
 * rank 0 over the communicator (the runtime's part, train.c); there
 * prof_trace_json writes the Chrome trace event JSON of all ranks (one
 * process per rank, one thread per track) and prof_table the end-of-run
 * table.
 *
 * Below the runtime (it includes nothing but the C library), so the loop,
 * the collectives (comm.c) and the device layer can all record into it.
 * One thread records: the loop's, which also runs the program and the
 * collectives. */
#ifndef HPDL_PROF_H
#define HPDL_PROF_H

#include <stdint.h>
#include <stdio.h>

/* The tracks: the trace's thread ids. */
typedef enum { PROF_STEP = 1, PROF_PROGRAM = 2, PROF_COMM = 3, PROF_NTRACKS = 4 } ProfTrack;

enum { PROF_DEFAULT_CAP = 1000000 };

/* What is known of a span; -1 / 0 / NULL: unknown. */
typedef struct {
  const char *cat;   /* "step", "phase", "forward", "op", "collective", "p2p", ... */
  const char *group; /* a collective's group ("dp", "pp", ...) */
  int64_t bytes;
  double flops;
  int peer;          /* a message's other rank (world rank) */
  int mb, chunk;     /* the micro-batch, the pipeline chunk */
  int64_t layer;     /* an op's layer of a repeated block */
} ProfArgs;

#define PROF_ARGS_NONE {NULL, NULL, 0, 0.0, -1, -1, -1, -1}

typedef struct Prof Prof;

/* cap: events kept (<= 0: PROF_DEFAULT_CAP). NULL when out of memory. */
Prof *prof_new(int64_t cap);
void prof_free(Prof *p);

/* The clock (seconds, monotonic). prof_origin makes `now` time 0 of the
 * trace (every rank calls it right after a barrier, so the ranks' tracks
 * line up); prof_time is seconds since it. */
double prof_clock(void);
void prof_origin(Prof *p);
double prof_time(const Prof *p);

/* Recording on or off (off: prof_span keeps nothing), and the step the
 * spans belong to (0-based; -1 none). */
void prof_enable(Prof *p, int on);
int prof_enabled(const Prof *p);
void prof_set_step(Prof *p, int64_t step);

/* A span from t0 to t1 (prof_time's seconds); a NULL a is PROF_ARGS_NONE. */
void prof_span(Prof *p, ProfTrack track, const char *name, double t0, double t1, const ProfArgs *a);

int64_t prof_count(const Prof *p);
int64_t prof_dropped(const Prof *p);

/* Who the rank is: the process's name in the trace. */
typedef struct {
  int rank, dp, tp, pp, cp; /* world rank; its index in each dimension */
  int64_t peak_rss;         /* bytes (getrusage's ru_maxrss) */
} ProfRankInfo;

/* The process's peak resident set (getrusage), in bytes. */
int64_t prof_peak_rss(void);

/* One rank's buffer as a block of bytes (malloc'd; *len). NULL when out of
 * memory. */
void *prof_pack(const Prof *p, const ProfRankInfo *who, size_t *len);

/* A received block, checked (NULL with a message in err when damaged). */
typedef struct ProfRank ProfRank;
ProfRank *prof_unpack(const void *buf, size_t len, char *err, size_t errlen);
void prof_rank_free(ProfRank *r);

/* The Chrome trace event JSON of n ranks' blocks (the object form:
 * traceEvents and otherData) to f; returns 0, -1 on a write error. */
int prof_trace_json(FILE *f, ProfRank *const *ranks, int n);

/* The end-of-run table (docs/runtime.md, "Profiling"): phases and ops by
 * total time over all ranks with their share of the step time, the
 * collectives' achieved bandwidth, each rank's peak memory. rows: the most
 * phase / op rows shown. */
void prof_table(FILE *f, ProfRank *const *ranks, int n, int rows);

#endif
