/* trace_read.h - the reader of `hpdlrun --profile` Chrome traces, for
 * `hpdlc plan --compare` (plan_compare.c sets what it measures beside the
 * plan; fuzz/fuzz_trace.c attacks it).
 *
 * The file (docs/runtime.md, "Profiling"): a JSON object with a
 * `traceEvents` array (a bare array of events is taken too), one process
 * per rank (`pid`, named "rank R (dp d, tp t, pp p, cp c)"), three tracks:
 * tid 1 step (cat "step" spans and their "phase"s), tid 2 program
 * (forward / backward spans; cat "op", "kernel", "gemm"), tid 3 comm (cat
 * "collective", "p2p", args.group). Complete events (`ph: "X"`) are kept,
 * each classified once (TraceKind); events of any other shape (other
 * phases, missing or mistyped fields, unknown tracks or categories) are
 * counted in `ignored`, not refused. At most max_events are kept; past
 * that they are counted in `truncated`.
 *
 * Errors name the file: "FILE: error: not JSON (line L, column C): ...",
 * "FILE: error: no 'traceEvents' array ...", "FILE: error: no step spans
 * ...", "FILE: error: cannot open: ...". */
#ifndef HPDL_TRACE_READ_H
#define HPDL_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

enum {
  TRACE_MAX_COMM = 64,            /* distinct (collective kind, group) pairs kept */
  TRACE_MAX_RANKS = 1 << 16,      /* a pid beyond is not a rank: ignored */
};
#define TRACE_MAX_FILE_BYTES ((size_t)1 << 30) /* a larger file is refused before it is parsed */
#define TRACE_DEFAULT_MAX_EVENTS ((size_t)8 << 20)

typedef enum TraceKind {
  TK_STEP,          /* cat "step" on the step track: one step of one rank */
  TK_PHASE_PROGRAM, /* phase "program step" */
  TK_PHASE_DATA,    /* phase "data" */
  TK_PHASE_OPT,     /* phases "optimizer update" and "norm" (the clipping's read, priced with the update) */
  TK_PHASE_OTHER,   /* any other phase (gradient reduction, norm, parameter gather) */
  TK_SPAN,          /* a program-track span that is not an op: forward, backward, parameters in, ... */
  TK_GEMM,          /* an op, kernel or GEMM that multiplies matrices */
  TK_MEMBOUND,      /* any other op or kernel */
  TK_COMM,          /* a collective or message; sub indexes TraceData.comm */
  TK_PHASE_CKPT,    /* phase "checkpoint": its step is not a training step the planner prices */
  TK_COUNT
} TraceKind;

typedef struct TraceEvent {
  double ts, dur; /* microseconds */
  int32_t rank;   /* pid */
  int32_t step;   /* args.step, or the step span holding ts; 0 when none */
  uint8_t kind;   /* TraceKind */
  uint8_t sub;    /* TK_COMM: index into comm[] */
} TraceEvent;

typedef struct TraceComm {
  char kind[24];  /* all_reduce, recv, ... */
  char group[8];  /* dp, tp, pp, cp, world, or "-" when the event has none */
} TraceComm;

typedef struct TraceData {
  const char *name;  /* the file, for messages */
  size_t max_events; /* the cap */
  TraceEvent *ev;
  size_t n, cap;
  size_t seen;       /* events in the array */
  size_t ignored;    /* of unknown shape */
  size_t truncated;  /* complete events past the cap */
  size_t op_events;  /* of the kept: TK_GEMM + TK_MEMBOUND */
  size_t step_spans;
  int ncomm;
  TraceComm comm[TRACE_MAX_COMM];
  size_t comm_dropped;  /* events of a pair past TRACE_MAX_COMM */
  int32_t nranks;       /* 1 + the largest pid kept */
  /* the layout from the process names (1 + the largest coordinate); 0 when no process is named so */
  int64_t dp, tp, pp, cp;
  int64_t dropped_events; /* otherData.dropped_events; -1 when absent */
} TraceData;

void trace_init(TraceData *t, const char *name, size_t max_events);
void trace_free(TraceData *t);
/* Reads a trace from memory / from the file t->name. 0, or -1 with a
 * message naming t->name in err. */
int trace_read_mem(TraceData *t, const char *data, size_t len, char *err, size_t errlen);
int trace_read_file(TraceData *t, char *err, size_t errlen);

/* What the trace measured, per rank per step (seconds), averaged over
 * every (rank, step) of the steps used: all steps, or all but the first
 * when there are two or more (the warm-up). */
typedef struct TraceMeasure {
  int steps;            /* distinct steps in the trace */
  int steps_used;
  int first_skipped;    /* 1: the first step was left out */
  int ckpt_skipped;     /* steps left out because they wrote a checkpoint (when others remain) */
  int64_t samples;      /* (rank, step) pairs averaged */
  double step_s;        /* the step spans */
  double gemm_s, membound_s;
  double compute_s;     /* forward / backward spans of rank-steps without op events, their messages taken out */
  double optimizer_s;   /* the "optimizer update" phase, the collectives inside it taken out */
  double data_s;        /* the "data" phase, the same */
  double bubble_s;      /* pp > 1: the "program step" phase not covered by program spans, and the
                         * pipeline's receives (waiting for the other stage); -1: not measured */
  double comm_s[TRACE_MAX_COMM];
  double comm_calls[TRACE_MAX_COMM]; /* per rank per step */
  double other_s;       /* step - every class above */
} TraceMeasure;

/* 1 when the collective comm[c] is a pipeline receive of a pp > 1 trace: its
 * time is the bubble's (the rank waits for the other stage), not its group's. */
int trace_comm_is_bubble(const TraceData *t, int c);

/* Averages t's events (as above). 0, or -1 with err when no step can be used. */
int trace_measure(const TraceData *t, TraceMeasure *m, char *err, size_t errlen);

#endif
