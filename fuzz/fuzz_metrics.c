/* fuzz_metrics.c - libFuzzer target for `hpdlrun --metrics` files as
 * `hpdlc report` reads them (compiler/driver/metrics.c) and draws them
 * (compiler/driver/report.c).
 *
 * The input is a metrics file: JSON lines such as
 *   {"step": 1, "loss": 5.52, "lr": 1e-05, "grad_norm": 2.23, "tokens_per_s": 54185, ...}
 * It is read twice, from memory and from a file in the scratch folder (the
 * streaming reader), and both must agree on the error message or on every
 * record. What was read must keep the reader's promises: steps from 1 to
 * 2^53 strictly increasing, values finite or null (NaN), no more records
 * than the cap (a third read with a cap of 3 checks the cut). Then the
 * report is drawn, HTML and SVG, with the two reads as two runs: every
 * coordinate must come out finite (no "nan" or "inf" in the output).
 * Messages are fine; a crash, a sanitizer report, a leak, a hang, a
 * disagreement or a broken promise (abort) is a bug. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "metrics.h"
#include "report.h"

/* enough for any input the fuzzer makes (each record is a line) */
enum { FUZZ_MAX_RECORDS = 1 << 20 };

static void promises(const MetricsRun *r) {
  if (r->n > r->max_records) abort();
  for (size_t i = 0; i < r->n; i++) {
    if (r->rec[i].step < 1 || r->rec[i].step > ((int64_t)1 << 53)) abort();
    if (i && r->rec[i].step <= r->rec[i - 1].step) abort();
    for (int f = 0; f < METRIC_COUNT; f++)
      if (isinf(r->rec[i].v[f])) abort();
  }
}

/* Draws the runs in both formats; the output must hold no "nan" or "inf"
 * (case aside): a coordinate that is not finite draws nothing anywhere. */
static void draw(const MetricsRun *runs, int nruns) {
  for (int fmt = 0; fmt < 2; fmt++) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) abort();
    if (report_write(f, runs, nruns, fmt ? REPORT_SVG : REPORT_HTML, NULL)) abort();
    fclose(f);
    for (size_t i = 0; i + 3 <= len; i++) {
      char a = (char)(text[i] | 0x20), b = (char)(text[i + 1] | 0x20), c = (char)(text[i + 2] | 0x20);
      if ((a == 'n' && b == 'a' && c == 'n') || (a == 'i' && b == 'n' && c == 'f')) {
        fprintf(stderr, "fuzz_metrics: the report holds \"%.40s\"\n", text + i);
        abort();
      }
    }
    free(text);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[4096];
  fuzz_write("m.jsonl", data, size, path);
  MetricsRun mem, file, small;
  char emem[1024], efile[1024], esmall[1024];
  metrics_init(&mem, path, FUZZ_MAX_RECORDS);
  metrics_init(&file, path, FUZZ_MAX_RECORDS);
  metrics_init(&small, path, 3);
  int rmem = metrics_read_mem(&mem, (const char *)data, size, emem, sizeof emem);
  int rfile = metrics_read_file(&file, efile, sizeof efile);
  int rsmall = metrics_read_mem(&small, (const char *)data, size, esmall, sizeof esmall);
  if (rmem != rfile || (rmem && strcmp(emem, efile))) {
    fprintf(stderr, "fuzz_metrics: the readers disagree:\n  memory: %s\n  file:   %s\n", rmem ? emem : "ok", rfile ? efile : "ok");
    abort();
  }
  if (!rmem) {
    if (mem.n != file.n || mem.replaced != file.replaced || mem.restarts != file.restarts ||
        memcmp(mem.rec, file.rec, mem.n * sizeof *mem.rec))
      abort();
    promises(&mem);
    /* the cut: the first 3 records kept (or fewer, or the error of a line before the cap) */
    if (!rsmall) promises(&small);
    MetricsRun both[2] = {mem, file};
    both[1].name = "second run <&\">";
    draw(both, 2);
    fuzz_note("%zu records, steps %lld-%lld, %d restart%s (%zu replaced)", mem.n, (long long)mem.rec[0].step,
              (long long)mem.rec[mem.n - 1].step, mem.restarts, mem.restarts == 1 ? "" : "s", mem.replaced);
  } else {
    fuzz_note("%s", emem);
  }
  metrics_free(&mem);
  metrics_free(&file);
  metrics_free(&small);
  fuzz_clean();
  return 0;
}
