/* metrics.c - reads `hpdlrun --metrics` files (metrics.h says what they
 * hold and how repeated steps are read). */
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const field_names[METRIC_COUNT] = {"loss", "lr", "grad_norm", "tokens_per_s", "step_s", "elapsed_s"};
/* hpdlrun has always written these; step_s and elapsed_s are not charted */
static const int field_required[METRIC_COUNT] = {1, 1, 1, 1, 0, 0};

/* Steps beyond 2^53 would not be exact on the chart's double axis, and no
 * run takes that many. */
#define METRICS_MAX_STEP ((int64_t)1 << 53)

const char *metrics_field_name(MetricField f) { return f >= 0 && f < METRIC_COUNT ? field_names[f] : "?"; }

void metrics_init(MetricsRun *run, const char *name, size_t max_records) {
  memset(run, 0, sizeof *run);
  run->name = name;
  run->max_records = max_records;
}

void metrics_free(MetricsRun *run) {
  free(run->rec);
  run->rec = NULL;
  run->n = run->cap = 0;
}

static void say(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static const char *type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a real number";
  case JSON_TRUE: return "true";
  case JSON_FALSE: return "false";
  case JSON_NULL: return "null";
  }
  return "?";
}

/* A NaN or an infinity is what a careless writer (Python's json.dumps,
 * printf's %g) puts where a number goes, and JSON has neither: found outside
 * the strings of the line, it is named with its field and column. Returns 1
 * when it said so. */
static int word_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

static int non_finite_token(const char *line, size_t len, char *err, size_t errlen) {
  static const char *const words[] = {"-Infinity", "+Infinity", "Infinity", "-inf", "+inf", "inf", "NaN", "-NaN", "nan", "-nan"};
  char key[48] = "";
  size_t klen = 0;
  int in_string = 0, in_key = 0;
  for (size_t i = 0; i < len; i++) {
    char c = line[i];
    if (in_string) {
      if (c == '\\') i++;
      else if (c == '"') in_string = 0;
      else if (in_key && klen + 1 < sizeof key) key[klen++] = c;
      continue;
    }
    if (c == '"') { /* a string: the key of what follows, if a ':' comes after it */
      in_string = in_key = 1;
      klen = 0;
      continue;
    }
    if (c == ':') {
      key[klen] = '\0';
      in_key = 0;
      continue;
    }
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
      size_t n = strlen(words[w]);
      if (i + n <= len && !memcmp(line + i, words[w], n) && !word_char(i ? line[i - 1] : ' ') &&
          !word_char(i + n < len ? line[i + n] : ' ')) {
        if (key[0]) say(err, errlen, "'%s' is %s (column %zu): JSON has no such number; write a non-finite value as null", key, words[w], i + 1);
        else say(err, errlen, "%s (column %zu): JSON has no such number; write a non-finite value as null", words[w], i + 1);
        return 1;
      }
    }
  }
  return 0;
}

/* jansson's message, with what a person reading the file needs added. */
static void json_problem(const char *line, size_t len, const json_error_t *je, char *err, size_t errlen) {
  if (non_finite_token(line, len, err, errlen)) return;
  if (strstr(je->text, "overflow") || strstr(je->text, "too big")) {
    say(err, errlen, "not JSON (column %d): %s: a number out of range", je->column, je->text);
    return;
  }
  say(err, errlen, "not JSON (column %d): %s", je->column, je->text);
}

/* Where a record's step goes: at the end, or over the records of the run it
 * restarts (the later records win). */
static int place(MetricsRun *run, int64_t step, int64_t lineno) {
  if (run->n == 0 || step > run->rec[run->n - 1].step) return 0;
  size_t lo = 0, hi = run->n; /* the first record with a step >= step */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (run->rec[mid].step < step) lo = mid + 1;
    else hi = mid;
  }
  run->replaced += run->n - lo;
  run->n = lo;
  if (run->restarts++ == 0) run->first_restart_line = lineno;
  return 0;
}

int metrics_add_line(MetricsRun *run, const char *line, size_t len, int64_t lineno, char *err, size_t errlen) {
  if (run->truncated) return 0;
  json_error_t je;
  /* duplicate keys are refused: which of two losses would be the step's? */
  json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
  if (!o) {
    json_problem(line, len, &je, err, errlen);
    return -1;
  }
  MetricsRecord r;
  int rc = -1;
  if (!json_is_object(o)) {
    say(err, errlen, "%s, not a JSON object with a step's metrics", type_name(o));
    goto done;
  }
  json_t *s = json_object_get(o, "step");
  if (!s) {
    say(err, errlen, "no 'step' field");
    goto done;
  }
  if (!json_is_integer(s)) {
    if (json_is_real(s)) say(err, errlen, "'step' is %.17g, not an integer", json_real_value(s));
    else say(err, errlen, "'step' is %s, not an integer", type_name(s));
    goto done;
  }
  r.step = json_integer_value(s);
  if (r.step < 1 || r.step > METRICS_MAX_STEP) {
    say(err, errlen, "'step' is %" PRId64 ", not a step from 1 to 2^53", (int64_t)r.step);
    goto done;
  }
  for (int f = 0; f < METRIC_COUNT; f++) {
    json_t *v = json_object_get(o, field_names[f]);
    if (!v) {
      if (field_required[f]) {
        say(err, errlen, "no '%s' field (a number, or null)", field_names[f]);
        goto done;
      }
      r.v[f] = NAN;
    } else if (json_is_null(v)) {
      r.v[f] = NAN;
    } else if (json_is_number(v)) {
      r.v[f] = json_number_value(v);
      if (!isfinite(r.v[f])) { /* jansson refuses overflows; kept for any other parser */
        say(err, errlen, "'%s' is not finite; write it as null", field_names[f]);
        goto done;
      }
    } else {
      say(err, errlen, "'%s' is %s, not a number or null", field_names[f], type_name(v));
      goto done;
    }
  }
  place(run, r.step, lineno);
  if (run->n >= run->max_records) {
    run->truncated = 1;
    run->truncated_line = lineno;
    rc = 0;
    goto done;
  }
  if (run->n == run->cap) {
    size_t cap = run->cap ? run->cap * 2 : 1024;
    if (cap > run->max_records) cap = run->max_records;
    MetricsRecord *p = realloc(run->rec, cap * sizeof *p);
    if (!p) {
      say(err, errlen, "out of memory after %zu records", run->n);
      goto done;
    }
    run->rec = p;
    run->cap = cap;
  }
  run->rec[run->n++] = r;
  rc = 0;
done:
  json_decref(o);
  return rc;
}

static int blank(const char *s, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
  return 1;
}

/* One line of the file: skipped when blank, else a record. `unterminated`:
 * the file's last line has no newline (a writer killed mid-line). */
static int feed(MetricsRun *run, const char *line, size_t len, int unterminated, char *err, size_t errlen) {
  run->lines++;
  if (blank(line, len)) return 0;
  char why[512];
  if (metrics_add_line(run, line, len, run->lines, why, sizeof why) == 0) return 0;
  say(err, errlen, "%s:%" PRId64 ": error: %s%s", run->name, run->lines, why,
      unterminated ? " (the last line, without a newline: a run killed while writing it?)" : "");
  return -1;
}

static int too_long(const MetricsRun *run, char *err, size_t errlen) {
  say(err, errlen, "%s:%" PRId64 ": error: a line of more than %d bytes: not a metrics record", run->name, run->lines + 1,
      METRICS_MAX_LINE);
  return -1;
}

static int finish(MetricsRun *run, char *err, size_t errlen) {
  if (run->n > 0) return 0;
  if (run->lines == 0) say(err, errlen, "%s: error: an empty file: no records", run->name);
  else say(err, errlen, "%s: error: no records in its %" PRId64 " blank line%s", run->name, run->lines, run->lines == 1 ? "" : "s");
  return -1;
}

int metrics_read_mem(MetricsRun *run, const char *data, size_t len, char *err, size_t errlen) {
  size_t at = 0;
  while (at < len && !run->truncated) {
    const char *nl = memchr(data + at, '\n', len - at);
    size_t n = nl ? (size_t)(nl - (data + at)) : len - at;
    if (n > METRICS_MAX_LINE) return too_long(run, err, errlen);
    if (feed(run, data + at, n, !nl, err, errlen)) return -1;
    at += n + (nl != NULL);
  }
  return finish(run, err, errlen);
}

int metrics_read_file(MetricsRun *run, char *err, size_t errlen) {
  FILE *f = fopen(run->name, "rb");
  if (!f) {
    say(err, errlen, "%s: error: cannot open: %s", run->name, strerror(errno));
    return -1;
  }
  /* a line at a time through a fixed buffer: a file of any size costs the
   * records kept and one line */
  char *line = malloc(METRICS_MAX_LINE), *block = malloc(1 << 16);
  int rc = 0;
  size_t used = 0, got;
  if (!line || !block) {
    say(err, errlen, "%s: error: out of memory", run->name);
    rc = -1;
    goto done;
  }
  while (!rc && !run->truncated && (got = fread(block, 1, 1 << 16, f)) > 0) {
    size_t i = 0;
    while (i < got && !run->truncated) {
      const char *nl = memchr(block + i, '\n', got - i);
      size_t take = nl ? (size_t)(nl - (block + i)) : got - i;
      if (used + take > METRICS_MAX_LINE) {
        rc = too_long(run, err, errlen);
        break;
      }
      memcpy(line + used, block + i, take);
      used += take;
      i += take;
      if (!nl) break;
      i++;
      if ((rc = feed(run, line, used, 0, err, errlen))) break;
      used = 0;
    }
  }
  if (!rc && ferror(f)) {
    say(err, errlen, "%s:%" PRId64 ": error: cannot read: %s", run->name, run->lines + 1, strerror(errno));
    rc = -1;
  }
  if (!rc && !run->truncated && used > 0) rc = feed(run, line, used, 1, err, errlen);
  if (!rc) rc = finish(run, err, errlen);
done:
  free(line);
  free(block);
  fclose(f);
  return rc;
}
