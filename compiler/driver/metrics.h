/* metrics.h - the reader of `hpdlrun --metrics` files, for `hpdlc report`
 * (report.h draws what it reads; fuzz/fuzz_metrics.c attacks it).
 *
 * A metrics file holds one JSON object a line, one per optimizer step
 * (docs/runtime.md, "Metrics"):
 *
 *   {"step": 3, "loss": 5.41, "lr": 0.0006, "grad_norm": 0.93,
 *    "tokens_per_s": 331200, "step_s": 0.0015, "elapsed_s": 0.21}
 *
 * `step` is an integer from 1; `loss`, `lr`, `grad_norm` and `tokens_per_s`
 * must be there, each a finite number or null (hpdlrun writes a non-finite
 * value as null: a gap in the chart); `step_s` and `elapsed_s` may be left
 * out (null then). Other fields are ignored, so that a newer hpdlrun's
 * files still read. Blank lines are skipped.
 *
 * Repeated steps: `hpdlrun --resume` appends to the file it resumes from,
 * starting again after its checkpoint's step, so a run killed after step 13
 * and resumed from the checkpoint of step 10 writes steps 11, 12, 13 twice.
 * A step that is not above the one before it is read as such a restart:
 * the later records win, the earlier records of that step and after are
 * dropped, and MetricsRun counts them (`replaced`, `restarts`).
 *
 * Bounds: a line is at most METRICS_MAX_LINE bytes and a run keeps at most
 * the `max_records` its caller gives (the memory of a record is 56 bytes),
 * so no file makes the reader allocate without bound. */
#ifndef HPDL_METRICS_H
#define HPDL_METRICS_H

#include <stddef.h>
#include <stdint.h>

enum { METRICS_MAX_LINE = 64 * 1024 };

/* The values of a record, in this order; NaN stands for null. */
typedef enum {
  METRIC_LOSS,
  METRIC_LR,
  METRIC_GRAD_NORM,
  METRIC_TOKENS_PER_S,
  METRIC_STEP_S,
  METRIC_ELAPSED_S,
  METRIC_COUNT
} MetricField;

/* The field's name in the file ("loss", "tokens_per_s", ...). */
const char *metrics_field_name(MetricField f);

typedef struct {
  int64_t step;
  double v[METRIC_COUNT];
} MetricsRecord;

typedef struct {
  const char *name;       /* the file as given (not owned) */
  MetricsRecord *rec;     /* steps strictly increasing */
  size_t n, cap;
  size_t max_records;     /* the cap the reader was given */
  int64_t lines;          /* lines read */
  size_t replaced;        /* records dropped because a later run repeated their step */
  int restarts;           /* how many times the step went back (resumed runs) */
  int64_t first_restart_line; /* the line of the first restart, 0 when none */
  int truncated;          /* 1: stopped at max_records; the rest of the file was not read */
  int64_t truncated_line; /* the line it stopped at */
} MetricsRun;

/* Starts an empty run. */
void metrics_init(MetricsRun *run, const char *name, size_t max_records);
void metrics_free(MetricsRun *run);

/* Adds line `lineno` (1-based; len bytes, no newline, may hold NUL bytes).
 * Returns 0, or -1 with the reason in err (without file and line, which
 * the caller prefixes: metrics_read_* do). At max_records it stops storing
 * and sets `truncated` (returns 0): the caller stops reading. */
int metrics_add_line(MetricsRun *run, const char *line, size_t len, int64_t lineno, char *err, size_t errlen);

/* Reads a whole file from memory, or from the file at run->name (streamed:
 * memory stays within the records kept and one line). Returns 0, or -1 with
 * "FILE:LINE: error: message" (or "FILE: error: message") in err. A file without records
 * is an error. */
int metrics_read_mem(MetricsRun *run, const char *data, size_t len, char *err, size_t errlen);
int metrics_read_file(MetricsRun *run, char *err, size_t errlen);

#endif
