/* report.h - `hpdlc report METRICS.jsonl... -o run.html|run.svg`: charts of
 * training runs from their `hpdlrun --metrics` files (read by metrics.h).
 *
 * Four charts - loss, learning rate, gradient norm, tokens/s - over the
 * step, each run a line of its own colour, a legend naming the files,
 * labelled axes with tick values. The HTML is one self-contained page (inline
 * SVG, no script, no network) with a summary table; the SVG is the four
 * charts on one canvas.
 *
 * Drawing is bounded, statistics are not thinned: a series keeps, per pixel
 * column of its chart, its first, lowest, highest and last point (so a
 * spike stays visible and the ends are exact), while the summary is computed
 * from every record. A null value is a gap in its line; a gap inside one
 * pixel column is not drawn. */
#ifndef HPDL_REPORT_H
#define HPDL_REPORT_H

#include <stdio.h>

#include "metrics.h"

typedef enum { REPORT_HTML, REPORT_SVG } ReportFormat;

/* Default cap on the records of all files together (--max-records). */
#define REPORT_MAX_RECORDS 10000000
/* At most this many files in one report (a legend line each). */
enum { REPORT_MAX_RUNS = 64 };

/* Writes the report of runs[0..nruns) (each with records) to out.
 * `title` may be NULL. Returns 0, or -1 when writing failed. */
int report_write(FILE *out, const MetricsRun *runs, int nruns, ReportFormat fmt, const char *title);

/* `hpdlc report`: argv[0] is "report". Returns the exit status: 0, 1 (a
 * file cannot be read or is not a metrics file; the output cannot be
 * written), 2 (a bad command line). */
int report_main(int argc, char **argv);

#endif
