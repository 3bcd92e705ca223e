/* fuzz_trace.c - libFuzzer target for `hpdlrun --profile` Chrome traces as
 * `hpdlc plan --compare` reads them (compiler/plan/trace_read.c).
 *
 * The input is a trace: {"traceEvents": [{"name": "step", "cat": "step",
 * "ph": "X", "pid": 0, "tid": 1, "ts": 10.5, "dur": 90.25, "args": {"step":
 * 1}}, ...], "otherData": {...}}. It is read twice, from memory and from a
 * file in the scratch folder, and both must agree on the error message or
 * on every event kept. What was read must keep the reader's promises: no
 * more events than the cap (a third read with a cap of 5 checks the cut),
 * every kept event with a finite start, a duration >= 0, a rank below
 * nranks, a known kind, a collective's index below ncomm, printable names.
 * Then the averages (trace_measure) must be finite, the durations of every
 * class >= 0 (the step, GEMM, memory-bound, collectives, calls), and the
 * steps used at most the steps seen. Messages are fine; a crash, a
 * sanitizer report, a leak, a hang, a disagreement or a broken promise
 * (abort) is a bug. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "trace_read.h"

enum { FUZZ_MAX_EVENTS = 1 << 20 };

static void promises(const TraceData *t) {
  if (t->n > t->max_events || t->op_events > t->n || t->step_spans > t->n || t->ncomm > TRACE_MAX_COMM) abort();
  for (size_t i = 0; i < t->n; i++) {
    const TraceEvent *e = &t->ev[i];
    if (!isfinite(e->ts) || !isfinite(e->dur) || e->dur < 0 || e->rank < 0 || e->rank >= t->nranks || e->kind >= TK_COUNT ||
        e->step < 0)
      abort();
    if (e->kind == TK_COMM && e->sub >= t->ncomm) abort();
    if (e->kind == TK_STEP && e->step == 0) abort();
  }
  for (int c = 0; c < t->ncomm; c++)
    for (const char *p = t->comm[c].kind; *p; p++)
      if (*p < 0x21 || *p > 0x7e || *p == '"' || *p == '\\') abort();
  if (t->dp < 0 || t->tp < 0 || t->pp < 0 || t->cp < 0) abort();
}

static void measure(const TraceData *t) {
  TraceMeasure m;
  char err[1024];
  if (trace_measure(t, &m, err, sizeof err)) {
    fuzz_note("%s", err);
    return;
  }
  if (m.steps_used > m.steps || m.steps_used < 1 || m.samples < 1) abort();
  double v[] = {m.step_s, m.gemm_s, m.membound_s, m.other_s, m.optimizer_s, m.data_s, m.compute_s, m.bubble_s};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
    if (!isfinite(v[i])) abort();
  if (m.step_s < 0 || m.gemm_s < 0 || m.membound_s < 0) abort();
  if (t->pp <= 1 && m.bubble_s != -1) abort();
  for (int c = 0; c < t->ncomm; c++)
    if (!isfinite(m.comm_s[c]) || m.comm_s[c] < 0 || m.comm_calls[c] < 0) abort();
  fuzz_note("%zu events kept, %zu ignored, %d steps (%d used), step %.6g s", t->n, t->ignored, m.steps, m.steps_used, m.step_s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[4096];
  fuzz_write("trace.json", data, size, path);
  TraceData mem, file, small;
  char emem[1024], efile[1024], esmall[1024];
  trace_init(&mem, path, FUZZ_MAX_EVENTS);
  trace_init(&file, path, FUZZ_MAX_EVENTS);
  trace_init(&small, path, 5);
  int rmem = trace_read_mem(&mem, (const char *)data, size, emem, sizeof emem);
  int rfile = trace_read_file(&file, efile, sizeof efile);
  int rsmall = trace_read_mem(&small, (const char *)data, size, esmall, sizeof esmall);
  if (rmem != rfile || (rmem && strcmp(emem, efile))) {
    fprintf(stderr, "fuzz_trace: the readers disagree:\n  memory: %s\n  file:   %s\n", rmem ? emem : "ok", rfile ? efile : "ok");
    abort();
  }
  if (!rmem) {
    if (mem.n != file.n || mem.ignored != file.ignored || mem.ncomm != file.ncomm ||
        memcmp(mem.ev, file.ev, mem.n * sizeof *mem.ev) || memcmp(mem.comm, file.comm, sizeof mem.comm))
      abort();
    promises(&mem);
    measure(&mem);
    if (!rsmall) {
      promises(&small);
      if (small.n > 5 || small.n + small.truncated > mem.n + mem.truncated) abort();
      measure(&small);
    }
  } else {
    fuzz_note("%s", emem);
  }
  trace_free(&mem);
  trace_free(&file);
  trace_free(&small);
  fuzz_clean();
  return 0;
}
