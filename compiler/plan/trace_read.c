/* trace_read.c - reads `hpdlrun --profile` Chrome traces and averages what
 * they measured per step (trace_read.h says what is kept and how). */
#include "trace_read.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void say(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

void trace_init(TraceData *t, const char *name, size_t max_events) {
  memset(t, 0, sizeof *t);
  t->name = name;
  t->max_events = max_events;
  t->dropped_events = -1;
}

void trace_free(TraceData *t) {
  free(t->ev);
  t->ev = NULL;
  t->n = t->cap = 0;
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

/* A name from the file as it is printed: printable ASCII letters, digits
 * and a few marks; anything else becomes '?'. */
static void clean_copy(char *dst, size_t n, const char *src) {
  size_t i = 0;
  for (; src[i] && i + 1 < n; i++) {
    char c = src[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.' ||
             c == '+';
    dst[i] = ok ? c : '?';
  }
  dst[i] = '\0';
}

static const char *str_of(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

/* An integer field in [lo, hi]; 0 with *out, -1 when absent or otherwise. */
static int int_of(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
  const json_t *v = json_object_get(o, key);
  if (!json_is_integer(v)) return -1;
  int64_t x = json_integer_value(v);
  if (x < lo || x > hi) return -1;
  *out = x;
  return 0;
}

static int num_of(const json_t *o, const char *key, double *out) {
  const json_t *v = json_object_get(o, key);
  if (!json_is_number(v)) return -1;
  double x = json_number_value(v);
  if (!isfinite(x)) return -1;
  *out = x;
  return 0;
}

static int is_comm_op(const char *name) {
  static const char *const ops[] = {"all_reduce", "all_gather", "reduce_scatter", "send", "recv", "isend", "broadcast",
                                    "barrier", "wait_sends", "shard_slice", "copy_to_group"};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if (!strcmp(name, ops[i])) return 1;
  return 0;
}

static int is_gemm(const char *cat, const char *name) {
  if (!strcmp(cat, "gemm")) return 1;
  return strstr(name, "matmul") != NULL || strstr(name, "gemm") != NULL;
}

static int comm_index(TraceData *t, const char *kind, const char *group) {
  char k[sizeof t->comm[0].kind] = {0}, g[sizeof t->comm[0].group] = {0};
  clean_copy(k, sizeof k, kind);
  if (!group) snprintf(g, sizeof g, "-");
  else if (strlen(group) >= sizeof g) snprintf(g, sizeof g, "?");
  else clean_copy(g, sizeof g, group);
  for (int i = 0; i < t->ncomm; i++)
    if (!strcmp(t->comm[i].kind, k) && !strcmp(t->comm[i].group, g)) return i;
  if (t->ncomm == TRACE_MAX_COMM) return -1;
  memcpy(t->comm[t->ncomm].kind, k, sizeof k);
  memcpy(t->comm[t->ncomm].group, g, sizeof g);
  return t->ncomm++;
}

/* "rank R (dp d, tp t, pp p, cp c)" */
static void process_name(TraceData *t, const char *s) {
  int r, d, tp, pp, cp, end = -1;
  if (sscanf(s, "rank %d (dp %d, tp %d, pp %d, cp %d)%n", &r, &d, &tp, &pp, &cp, &end) != 5 || end < 0 || s[end]) return;
  if (r < 0 || d < 0 || tp < 0 || pp < 0 || cp < 0 || d >= TRACE_MAX_RANKS || tp >= TRACE_MAX_RANKS || pp >= TRACE_MAX_RANKS ||
      cp >= TRACE_MAX_RANKS)
    return;
  if (d + 1 > t->dp) t->dp = d + 1;
  if (tp + 1 > t->tp) t->tp = tp + 1;
  if (pp + 1 > t->pp) t->pp = pp + 1;
  if (cp + 1 > t->cp) t->cp = cp + 1;
}

/* One event: kept (0), ignored (1), or out of memory (-1). */
static int event(TraceData *t, const json_t *e) {
  if (!json_is_object(e)) return 1;
  const char *ph = str_of(e, "ph");
  if (!ph) return 1;
  int64_t pid, tid;
  if (!strcmp(ph, "M")) {
    const char *name = str_of(e, "name");
    json_t *args = json_object_get(e, "args");
    if (!name || !json_is_object(args)) return 1;
    if (!strcmp(name, "process_name")) {
      const char *s = str_of(args, "name");
      if (!s) return 1;
      process_name(t, s);
    }
    return 0;
  }
  if (strcmp(ph, "X")) return 1;
  const char *name = str_of(e, "name"), *cat = str_of(e, "cat");
  double ts, dur;
  if (!name || !cat || int_of(e, "pid", 0, TRACE_MAX_RANKS - 1, &pid) || int_of(e, "tid", INT32_MIN, INT32_MAX, &tid) ||
      num_of(e, "ts", &ts) || num_of(e, "dur", &dur))
    return 1;
  if (dur < 0 || dur > 1e13 || fabs(ts) > 1e15) return 1;
  json_t *args = json_object_get(e, "args");
  if (args && !json_is_object(args)) return 1;
  int64_t step = 0;
  if (args && json_object_get(args, "step") && int_of(args, "step", 1, INT32_MAX, &step)) return 1;
  TraceEvent ev;
  memset(&ev, 0, sizeof ev); /* the padding too: events are compared byte for byte (fuzz_trace.c) */
  ev.ts = ts;
  ev.dur = dur;
  ev.rank = (int32_t)pid;
  ev.step = (int32_t)step;
  if (tid == 1 && !strcmp(cat, "step")) {
    if (step == 0) return 1; /* a step span must say which */
    ev.kind = TK_STEP;
  } else if (tid == 1 && !strcmp(cat, "phase")) {
    ev.kind = !strcmp(name, "program step")       ? TK_PHASE_PROGRAM
              : !strcmp(name, "data")             ? TK_PHASE_DATA
              : !strcmp(name, "optimizer update") ? TK_PHASE_OPT
              : !strcmp(name, "norm")             ? TK_PHASE_OPT /* the gradient norm: the planner prices it with the update */
              : !strcmp(name, "checkpoint")       ? TK_PHASE_CKPT
                                                  : TK_PHASE_OTHER;
  } else if (tid == 2 && (!strcmp(cat, "op") || !strcmp(cat, "kernel") || !strcmp(cat, "gemm"))) {
    if (is_comm_op(name)) return 0; /* timed on the comm track too: counted there */
    ev.kind = is_gemm(cat, name) ? TK_GEMM : TK_MEMBOUND;
  } else if (tid == 2) {
    ev.kind = TK_SPAN;
  } else if (tid == 3 && (!strcmp(cat, "collective") || !strcmp(cat, "p2p"))) {
    int k = comm_index(t, name, args ? str_of(args, "group") : NULL);
    if (k < 0) {
      t->comm_dropped++;
      return 0;
    }
    ev.kind = TK_COMM;
    ev.sub = (uint8_t)k;
  } else {
    return 1;
  }
  if (t->n >= t->max_events) {
    t->truncated++;
    return 0;
  }
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 4096;
    if (cap > t->max_events) cap = t->max_events;
    TraceEvent *p = realloc(t->ev, cap * sizeof *p);
    if (!p) return -1;
    t->ev = p;
    t->cap = cap;
  }
  t->ev[t->n++] = ev;
  if (ev.kind == TK_GEMM || ev.kind == TK_MEMBOUND) t->op_events++;
  if (ev.kind == TK_STEP) t->step_spans++;
  if (pid + 1 > t->nranks) t->nranks = (int32_t)(pid + 1);
  return 0;
}

static int by_rank_ts(const void *a, const void *b) {
  const TraceEvent *x = a, *y = b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  return 0;
}

/* Events without args.step: the step span of their rank that holds their start. */
static int assign_steps(TraceData *t) {
  size_t ns = 0, missing = 0;
  for (size_t i = 0; i < t->n; i++) {
    ns += t->ev[i].kind == TK_STEP;
    missing += t->ev[i].step == 0;
  }
  if (!missing || !ns) return 0;
  TraceEvent *s = malloc(ns * sizeof *s);
  if (!s) return -1;
  ns = 0;
  for (size_t i = 0; i < t->n; i++)
    if (t->ev[i].kind == TK_STEP) s[ns++] = t->ev[i];
  qsort(s, ns, sizeof *s, by_rank_ts);
  for (size_t i = 0; i < t->n; i++) {
    TraceEvent *e = &t->ev[i];
    if (e->step) continue;
    size_t lo = 0, hi = ns; /* the first span after (rank, ts) */
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (s[mid].rank < e->rank || (s[mid].rank == e->rank && s[mid].ts <= e->ts)) lo = mid + 1;
      else hi = mid;
    }
    if (lo > 0 && s[lo - 1].rank == e->rank && e->ts <= s[lo - 1].ts + s[lo - 1].dur) e->step = s[lo - 1].step;
  }
  free(s);
  return 0;
}

int trace_read_mem(TraceData *t, const char *data, size_t len, char *err, size_t errlen) {
  if (len > TRACE_MAX_FILE_BYTES) {
    say(err, errlen, "%s: error: %zu bytes, more than the %zu a trace may have", t->name, len, TRACE_MAX_FILE_BYTES);
    return -1;
  }
  if (len == 0) {
    say(err, errlen, "%s: error: an empty file: not a Chrome trace of hpdlrun --profile", t->name);
    return -1;
  }
  json_error_t je;
  json_t *root = json_loadb(data, len, 0, &je);
  if (!root) {
    say(err, errlen, "%s: error: not JSON (line %d, column %d): %s: not a Chrome trace of hpdlrun --profile", t->name, je.line,
        je.column, je.text);
    return -1;
  }
  int rc = -1;
  json_t *events = root;
  if (json_is_object(root)) {
    events = json_object_get(root, "traceEvents");
    if (!events) {
      say(err, errlen, "%s: error: no 'traceEvents' array: not a Chrome trace of hpdlrun --profile", t->name);
      goto done;
    }
    json_t *other = json_object_get(root, "otherData");
    int64_t dropped;
    if (json_is_object(other) && !int_of(other, "dropped_events", 0, INT64_MAX, &dropped)) t->dropped_events = dropped;
  }
  if (!json_is_array(events)) {
    if (events == root) say(err, errlen, "%s: error: JSON %s, not a Chrome trace (an object with 'traceEvents')", t->name, type_name(root));
    else say(err, errlen, "%s: error: 'traceEvents' is %s, not an array of events", t->name, type_name(events));
    goto done;
  }
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e) {
    t->seen++;
    int r = event(t, e);
    if (r < 0) {
      say(err, errlen, "%s: error: out of memory after %zu events", t->name, t->n);
      goto done;
    }
    t->ignored += (size_t)r;
  }
  if (t->step_spans == 0) {
    say(err, errlen,
        "%s: error: no step spans (complete events of cat \"step\" on tid 1 with args.step) in its %zu events: not a profile of "
        "hpdlrun --profile?",
        t->name, t->seen);
    goto done;
  }
  if (assign_steps(t)) {
    say(err, errlen, "%s: error: out of memory", t->name);
    goto done;
  }
  rc = 0;
done:
  json_decref(root);
  return rc;
}

int trace_read_file(TraceData *t, char *err, size_t errlen) {
  FILE *f = fopen(t->name, "rb");
  if (!f) {
    say(err, errlen, "%s: error: cannot open: %s", t->name, strerror(errno));
    return -1;
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = -1;
  for (;;) {
    if (len == cap) {
      if (cap > TRACE_MAX_FILE_BYTES) {
        say(err, errlen, "%s: error: more than the %zu bytes a trace may have", t->name, TRACE_MAX_FILE_BYTES);
        goto done;
      }
      size_t nc = cap ? cap * 2 : 1 << 16;
      char *p = realloc(buf, nc);
      if (!p) {
        say(err, errlen, "%s: error: out of memory after %zu bytes", t->name, len);
        goto done;
      }
      buf = p;
      cap = nc;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  if (ferror(f)) {
    say(err, errlen, "%s: error: cannot read: %s", t->name, strerror(errno));
    goto done;
  }
  rc = trace_read_mem(t, buf, len, err, errlen);
done:
  free(buf);
  fclose(f);
  return rc;
}

/* ------------------------------------------------------------------ */
/* the averages                                                         */

static int by_rank_step_ts(const void *a, const void *b) {
  const TraceEvent *x = a, *y = b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  return 0;
}

/* The sum of the durations of the intervals whose start lies in [a, b]:
 * starts sorted, pre their prefix sums (pre[0] = 0). */
static double within(const double *starts, const double *pre, size_t n, double a, double b) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (starts[mid] < a) lo = mid + 1;
    else hi = mid;
  }
  size_t first = lo;
  hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (starts[mid] <= b) lo = mid + 1;
    else hi = mid;
  }
  return pre[lo] - pre[first];
}

int trace_comm_is_bubble(const TraceData *t, int c) {
  return t->pp > 1 && c >= 0 && c < t->ncomm && !strcmp(t->comm[c].kind, "recv") && !strcmp(t->comm[c].group, "pp");
}

static int by_int(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return x < y ? -1 : x > y;
}

int trace_measure(const TraceData *t, TraceMeasure *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  m->bubble_s = -1;
  int rc = -1;
  int32_t *steps = NULL;
  TraceEvent *ev = NULL;
  double *cs = NULL, *cp = NULL, *ss = NULL, *sp = NULL;
  size_t ns = 0;
  steps = malloc((t->step_spans ? t->step_spans : 1) * sizeof *steps);
  ev = malloc((t->n ? t->n : 1) * sizeof *ev);
  cs = malloc((t->n + 1) * sizeof *cs);
  cp = malloc((t->n + 1) * sizeof *cp);
  ss = malloc((t->n + 1) * sizeof *ss);
  sp = malloc((t->n + 1) * sizeof *sp);
  if (!steps || !ev || !cs || !cp || !ss || !sp) {
    say(err, errlen, "%s: error: out of memory", t->name);
    goto done;
  }
  for (size_t i = 0; i < t->n; i++)
    if (t->ev[i].kind == TK_STEP) steps[ns++] = t->ev[i].step;
  if (ns == 0) {
    say(err, errlen, "%s: error: no step spans", t->name);
    goto done;
  }
  qsort(steps, ns, sizeof *steps, by_int);
  size_t nd = 0;
  for (size_t i = 0; i < ns; i++)
    if (i == 0 || steps[i] != steps[nd - 1]) steps[nd++] = steps[i];
  m->steps = (int)nd;
  int32_t first = nd >= 2 ? steps[0] : INT32_MIN;
  m->first_skipped = nd >= 2;
  m->steps_used = (int)(nd >= 2 ? nd - 1 : nd);
  /* A step that wrote a checkpoint (hpdlrun saves the final state, and
   * every --checkpoint-every steps) is not the training step the planner
   * prices: such steps are left out while others remain. steps[] marks
   * them by negating (they are >= 1). */
  int ckpt_steps = 0;
  for (size_t i = 0; i < t->n; i++)
    if (t->ev[i].kind == TK_PHASE_CKPT)
      for (size_t s = 0; s < nd; s++)
        if (steps[s] == t->ev[i].step && steps[s] != first) steps[s] = -steps[s], ckpt_steps++;
  int drop_ckpt = ckpt_steps > 0 && ckpt_steps < m->steps_used;
  if (drop_ckpt) m->ckpt_skipped = ckpt_steps, m->steps_used -= ckpt_steps;
  memcpy(ev, t->ev, t->n * sizeof *ev);
  qsort(ev, t->n, sizeof *ev, by_rank_step_ts);
  double sum[TK_COUNT] = {0}, comm[TRACE_MAX_COMM] = {0}, calls[TRACE_MAX_COMM] = {0}, bubble = 0;
  int64_t samples = 0;
  for (size_t i = 0; i < t->n;) {
    size_t j = i;
    while (j < t->n && ev[j].rank == ev[i].rank && ev[j].step == ev[i].step) j++;
    /* events [i, j): one rank's step */
    int used = ev[i].step != 0 && ev[i].step != first;
    for (size_t s = 0; s < nd && used && drop_ckpt; s++) used = steps[s] != -ev[i].step;
    double step_d = 0;
    int has_step = 0;
    size_t nc = 0, nsp = 0, nops = 0;
    cp[0] = sp[0] = 0;
    for (size_t k = i; k < j && used; k++) {
      const TraceEvent *e = &ev[k];
      if (e->kind == TK_STEP) {
        has_step = 1;
        step_d += e->dur;
      } else if (e->kind == TK_COMM) {
        cs[nc] = e->ts;
        cp[nc + 1] = cp[nc] + e->dur;
        nc++;
      } else if (e->kind == TK_SPAN) {
        ss[nsp] = e->ts;
        sp[nsp + 1] = sp[nsp] + e->dur;
        nsp++;
      } else if (e->kind == TK_GEMM || e->kind == TK_MEMBOUND) {
        nops++;
      }
    }
    if (used && has_step) {
      samples++;
      sum[TK_STEP] += step_d;
      for (size_t k = i; k < j; k++) {
        const TraceEvent *e = &ev[k];
        switch (e->kind) {
        case TK_GEMM:
        case TK_MEMBOUND: sum[e->kind] += e->dur; break;
        case TK_COMM:
          comm[e->sub] += e->dur;
          calls[e->sub] += 1;
          break;
        case TK_PHASE_OPT:
        case TK_PHASE_DATA: sum[e->kind] += e->dur - within(cs, cp, nc, e->ts, e->ts + e->dur); break;
        case TK_SPAN:
          if (!nops) sum[TK_SPAN] += e->dur - within(cs, cp, nc, e->ts, e->ts + e->dur);
          break;
        case TK_PHASE_PROGRAM:
          if (t->pp > 1) bubble += e->dur - within(ss, sp, nsp, e->ts, e->ts + e->dur);
          break;
        default: break;
        }
      }
    }
    i = j;
  }
  if (samples == 0) {
    say(err, errlen, "%s: error: no step of any rank to average", t->name);
    goto done;
  }
  double k = 1e-6 / (double)samples; /* microseconds summed -> seconds per rank-step */
  m->samples = samples;
  m->step_s = sum[TK_STEP] * k;
  m->gemm_s = sum[TK_GEMM] * k;
  m->membound_s = sum[TK_MEMBOUND] * k;
  m->compute_s = sum[TK_SPAN] * k;
  m->optimizer_s = sum[TK_PHASE_OPT] * k;
  m->data_s = sum[TK_PHASE_DATA] * k;
  double rest = m->step_s - m->gemm_s - m->membound_s - m->compute_s - m->optimizer_s - m->data_s;
  if (t->pp > 1) {
    m->bubble_s = bubble * k;
    rest -= m->bubble_s;
    for (int c = 0; c < t->ncomm; c++)
      if (trace_comm_is_bubble(t, c)) rest -= comm[c] * k;
  }
  for (int c = 0; c < t->ncomm; c++) {
    m->comm_s[c] = comm[c] * k;
    m->comm_calls[c] = calls[c] / (double)samples;
    if (trace_comm_is_bubble(t, c)) m->bubble_s += m->comm_s[c]; /* rest has it through the bubble */
    else rest -= m->comm_s[c];
  }
  m->other_s = rest;
  rc = 0;
done:
  free(steps);
  free(ev);
  free(cs);
  free(cp);
  free(ss);
  free(sp);
  return rc;
}
