/* prof.c - a rank's timeline, its travel to rank 0, the trace and the table
 * (prof.h). */
#include "prof.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

typedef struct {
  double t0, t1, flops;
  int64_t bytes, layer, step;
  int32_t name, cat, group; /* string indices; -1 none */
  int32_t peer, mb, chunk, track, pad;
} Ev;

typedef struct {
  char *blob; /* NUL-separated */
  int64_t len, cap;
  int32_t *off; /* string i at blob + off[i] */
  int32_t n, ncap;
  int32_t *hash; /* open addressing: string index + 1; 0 empty */
  int32_t hcap;
} Strs;

struct Prof {
  Ev *ev;
  int64_t n, cap, alloc, dropped;
  double origin;
  int on;
  int64_t step;
  Strs s;
};

struct ProfRank {
  ProfRankInfo who;
  int64_t n, dropped, cap;
  Ev *ev;
  char *blob;
  int32_t *off;
  int32_t nstr;
};

enum { MAX_STRINGS = 1 << 20 };

double prof_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

Prof *prof_new(int64_t cap) {
  Prof *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->cap = cap > 0 ? cap : PROF_DEFAULT_CAP;
  p->step = -1;
  p->origin = prof_clock();
  return p;
}

void prof_free(Prof *p) {
  if (!p) return;
  free(p->ev);
  free(p->s.blob);
  free(p->s.off);
  free(p->s.hash);
  free(p);
}

void prof_origin(Prof *p) { p->origin = prof_clock(); }
double prof_time(const Prof *p) { return prof_clock() - p->origin; }
void prof_enable(Prof *p, int on) { p->on = on; }
int prof_enabled(const Prof *p) { return p && p->on; }
void prof_set_step(Prof *p, int64_t step) { p->step = step; }
int64_t prof_count(const Prof *p) { return p->n; }
int64_t prof_dropped(const Prof *p) { return p->dropped; }

static uint32_t hash_str(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

/* The string's index, added when new; -1 when out of room. */
static int32_t intern(Strs *s, const char *str) {
  if (!str) return -1;
  if (s->n + 1 > s->hcap / 2) {
    int32_t hc = s->hcap ? s->hcap * 2 : 256;
    if (s->n >= MAX_STRINGS) goto find_only;
    int32_t *h = calloc((size_t)hc, sizeof *h);
    if (!h) goto find_only;
    for (int32_t i = 0; i < s->n; i++) {
      uint32_t k = hash_str(s->blob + s->off[i]) & (uint32_t)(hc - 1);
      while (h[k]) k = (k + 1) & (uint32_t)(hc - 1);
      h[k] = i + 1;
    }
    free(s->hash);
    s->hash = h;
    s->hcap = hc;
  }
find_only:
  if (!s->hcap) return -1;
  uint32_t k = hash_str(str) & (uint32_t)(s->hcap - 1);
  while (s->hash[k]) {
    if (!strcmp(s->blob + s->off[s->hash[k] - 1], str)) return s->hash[k] - 1;
    k = (k + 1) & (uint32_t)(s->hcap - 1);
  }
  if (s->n + 1 > s->hcap / 2 + s->hcap / 4) return -1; /* the table could not grow */
  int64_t l = (int64_t)strlen(str) + 1;
  if (s->len + l > s->cap) {
    int64_t c = s->cap ? s->cap * 2 : 4096;
    while (c < s->len + l) c *= 2;
    char *b = realloc(s->blob, (size_t)c);
    if (!b) return -1;
    s->blob = b;
    s->cap = c;
  }
  if (s->n >= s->ncap) {
    int32_t c = s->ncap ? s->ncap * 2 : 128;
    int32_t *o = realloc(s->off, sizeof *o * (size_t)c);
    if (!o) return -1;
    s->off = o;
    s->ncap = c;
  }
  memcpy(s->blob + s->len, str, (size_t)l);
  s->off[s->n] = (int32_t)s->len;
  s->len += l;
  s->hash[k] = s->n + 1;
  return s->n++;
}

void prof_span(Prof *p, ProfTrack track, const char *name, double t0, double t1, const ProfArgs *a) {
  if (!p || !p->on) return;
  if (p->n >= p->cap) {
    p->dropped++;
    return;
  }
  if (p->n >= p->alloc) {
    int64_t c = p->alloc ? p->alloc * 2 : 4096;
    if (c > p->cap) c = p->cap;
    Ev *ev = realloc(p->ev, sizeof *ev * (size_t)c);
    if (!ev) {
      p->dropped++;
      return;
    }
    p->ev = ev;
    p->alloc = c;
  }
  static const ProfArgs none = PROF_ARGS_NONE;
  if (!a) a = &none;
  Ev *e = &p->ev[p->n++];
  memset(e, 0, sizeof *e);
  e->t0 = t0;
  e->t1 = t1 >= t0 ? t1 : t0;
  e->flops = a->flops;
  e->bytes = a->bytes;
  e->layer = a->layer;
  e->step = p->step;
  e->name = intern(&p->s, name ? name : "?");
  e->cat = intern(&p->s, a->cat);
  e->group = intern(&p->s, a->group);
  e->peer = a->peer;
  e->mb = a->mb;
  e->chunk = a->chunk;
  e->track = (int32_t)track;
}

int64_t prof_peak_rss(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (int64_t)ru.ru_maxrss * 1024; /* Linux: kilobytes */
}

/* ---- the block that travels to rank 0 ---- */

typedef struct {
  char magic[8]; /* "HPDLPRF1" */
  int32_t rank, dp, tp, pp, cp, nstr;
  int64_t n, dropped, cap, peak_rss, blob_len, ev_size;
} Head;

void *prof_pack(const Prof *p, const ProfRankInfo *who, size_t *len) {
  Head h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, "HPDLPRF1", 8);
  h.rank = who->rank;
  h.dp = who->dp;
  h.tp = who->tp;
  h.pp = who->pp;
  h.cp = who->cp;
  h.peak_rss = who->peak_rss;
  h.nstr = p->s.n;
  h.n = p->n;
  h.dropped = p->dropped;
  h.cap = p->cap;
  h.blob_len = p->s.len;
  h.ev_size = (int64_t)sizeof(Ev);
  size_t n = sizeof h + (size_t)h.blob_len + sizeof(Ev) * (size_t)h.n;
  unsigned char *b = malloc(n ? n : 1);
  if (!b) return NULL;
  memcpy(b, &h, sizeof h);
  if (h.blob_len) memcpy(b + sizeof h, p->s.blob, (size_t)h.blob_len);
  if (h.n) memcpy(b + sizeof h + h.blob_len, p->ev, sizeof(Ev) * (size_t)h.n);
  *len = n;
  return b;
}

void prof_rank_free(ProfRank *r) {
  if (!r) return;
  free(r->ev);
  free(r->blob);
  free(r->off);
  free(r);
}

ProfRank *prof_unpack(const void *buf, size_t len, char *err, size_t errlen) {
  const unsigned char *b = buf;
  Head h;
  if (len < sizeof h) {
    snprintf(err, errlen, "a profile block of %zu bytes (too short)", len);
    return NULL;
  }
  memcpy(&h, b, sizeof h);
  if (memcmp(h.magic, "HPDLPRF1", 8) || h.ev_size != (int64_t)sizeof(Ev) || h.n < 0 || h.blob_len < 0 || h.nstr < 0 ||
      sizeof h + (size_t)h.blob_len + sizeof(Ev) * (size_t)h.n != len) {
    snprintf(err, errlen, "a damaged profile block (%zu bytes)", len);
    return NULL;
  }
  ProfRank *r = calloc(1, sizeof *r);
  if (!r) goto oom;
  r->who.rank = h.rank;
  r->who.dp = h.dp;
  r->who.tp = h.tp;
  r->who.pp = h.pp;
  r->who.cp = h.cp;
  r->who.peak_rss = h.peak_rss;
  r->n = h.n;
  r->dropped = h.dropped;
  r->cap = h.cap;
  r->nstr = h.nstr;
  r->blob = malloc((size_t)h.blob_len + 1);
  r->ev = malloc(sizeof(Ev) * (size_t)h.n + 1);
  r->off = malloc(sizeof(int32_t) * (size_t)h.nstr + 1);
  if (!r->blob || !r->ev || !r->off) goto oom;
  memcpy(r->blob, b + sizeof h, (size_t)h.blob_len);
  r->blob[h.blob_len] = 0;
  memcpy(r->ev, b + sizeof h + h.blob_len, sizeof(Ev) * (size_t)h.n);
  int32_t k = 0;
  for (int64_t i = 0; i < h.blob_len && k < h.nstr; k++) {
    r->off[k] = (int32_t)i;
    i += (int64_t)strlen(r->blob + i) + 1;
  }
  if (k != h.nstr) {
    snprintf(err, errlen, "a damaged profile block (its strings)");
    prof_rank_free(r);
    return NULL;
  }
  return r;
oom:
  snprintf(err, errlen, "out of memory for a profile block of %zu bytes", len);
  prof_rank_free(r);
  return NULL;
}

static const char *str_of(const ProfRank *r, int32_t i) { return i >= 0 && i < r->nstr ? r->blob + r->off[i] : NULL; }

/* ---- the trace ---- */

static const char *const track_names[PROF_NTRACKS] = {"?", "step", "program", "comm"};

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

int prof_trace_json(FILE *f, ProfRank *const *ranks, int n) {
  int64_t dropped = 0, events = 0;
  fprintf(f, "{\"displayTimeUnit\": \"ms\",\n \"traceEvents\": [\n");
  int first = 1;
#define SEP() (fputs(first ? "  " : ",\n  ", f), first = 0)
  for (int i = 0; i < n; i++) {
    const ProfRank *r = ranks[i];
    int pid = r->who.rank;
    dropped += r->dropped;
    events += r->n;
    SEP();
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"rank %d (dp %d, tp %d, pp %d, cp %d)\"}}",
            pid, pid, r->who.dp, r->who.tp, r->who.pp, r->who.cp);
    SEP();
    fprintf(f, "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"sort_index\": %d}}", pid, pid);
    if (r->dropped) {
      SEP();
      fprintf(f, "{\"name\": \"process_labels\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"labels\": \"%" PRId64
                 " events dropped (the cap is %" PRId64 ")\"}}", pid, r->dropped, r->cap);
    }
    for (int t = 1; t < PROF_NTRACKS; t++) {
      SEP();
      fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}}", pid, t, track_names[t]);
      SEP();
      fprintf(f, "{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"sort_index\": %d}}", pid, t, t);
    }
    for (int64_t k = 0; k < r->n; k++) {
      const Ev *e = &r->ev[k];
      const char *name = str_of(r, e->name), *cat = str_of(r, e->cat), *group = str_of(r, e->group);
      int tid = e->track > 0 && e->track < PROF_NTRACKS ? e->track : 2;
      SEP();
      fputs("{\"name\": ", f);
      json_str(f, name ? name : "?");
      fputs(", \"cat\": ", f);
      json_str(f, cat ? cat : track_names[tid]);
      fprintf(f, ", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {", pid, tid, e->t0 * 1e6,
              (e->t1 - e->t0) * 1e6);
      int a = 0;
#define ARG() (a++ ? ", " : "")
      if (e->step >= 0) fprintf(f, "%s\"step\": %" PRId64, ARG(), e->step + 1);
      if (group) {
        fprintf(f, "%s\"group\": ", ARG());
        json_str(f, group);
      }
      if (e->bytes > 0) fprintf(f, "%s\"bytes\": %" PRId64, ARG(), e->bytes);
      if (e->peer >= 0) fprintf(f, "%s\"peer\": %d", ARG(), e->peer);
      if (e->mb >= 0) fprintf(f, "%s\"micro_batch\": %d", ARG(), e->mb);
      if (e->chunk >= 0) fprintf(f, "%s\"chunk\": %d", ARG(), e->chunk);
      if (e->layer >= 0) fprintf(f, "%s\"layer\": %" PRId64, ARG(), e->layer);
      if (e->flops > 0) fprintf(f, "%s\"flops\": %.0f", ARG(), e->flops);
      if (e->bytes > 0 && e->t1 > e->t0 && tid == PROF_COMM) fprintf(f, "%s\"GB_per_s\": %.4f", ARG(), (double)e->bytes / (e->t1 - e->t0) / 1e9);
#undef ARG
      fputs("}}", f);
    }
  }
#undef SEP
  fprintf(f, "\n ],\n \"otherData\": {\"producer\": \"hpdlrun --profile\", \"ranks\": %d, \"events\": %" PRId64 ", \"dropped_events\": %" PRId64
             ", \"event_cap_per_rank\": %" PRId64 ", \"dropped_per_rank\": [",
          n, events, dropped, n ? ranks[0]->cap : 0);
  for (int i = 0; i < n; i++) fprintf(f, "%s%" PRId64, i ? ", " : "", ranks[i]->dropped);
  fprintf(f, "], \"peak_rss_bytes\": [");
  for (int i = 0; i < n; i++) fprintf(f, "%s%" PRId64, i ? ", " : "", ranks[i]->who.peak_rss);
  fprintf(f, "], \"clock\": \"each rank's monotonic clock from a barrier before the first step; ts and dur in microseconds\"}\n}\n");
  return ferror(f) ? -1 : 0;
}

/* ---- the table ---- */

typedef struct {
  const char *track, *name, *group;
  int64_t calls, bytes;
  double total, flops;
} Row;

static int row_cmp(const void *a, const void *b) {
  double x = ((const Row *)a)->total, y = ((const Row *)b)->total;
  return x < y ? 1 : x > y ? -1 : 0;
}

static Row *row_of(Row **rows, int *n, int *cap, const char *track, const char *name, const char *group) {
  for (int i = 0; i < *n; i++)
    if ((*rows)[i].track == track && !strcmp((*rows)[i].name, name) &&
        ((!group && !(*rows)[i].group) || (group && (*rows)[i].group && !strcmp(group, (*rows)[i].group))))
      return &(*rows)[i];
  if (*n >= *cap) {
    int c = *cap ? *cap * 2 : 64;
    Row *r = realloc(*rows, sizeof *r * (size_t)c);
    if (!r) return NULL;
    *rows = r;
    *cap = c;
  }
  Row *r = &(*rows)[(*n)++];
  memset(r, 0, sizeof *r);
  r->track = track;
  r->name = name;
  r->group = group;
  return r;
}

void prof_table(FILE *f, ProfRank *const *ranks, int n, int nrows) {
  Row *rows = NULL, *comm = NULL;
  int nr = 0, cr = 0, nc = 0, cc = 0;
  double step_total = 0;
  int64_t steps = 0, dropped = 0;
  for (int i = 0; i < n; i++) {
    const ProfRank *r = ranks[i];
    dropped += r->dropped;
    for (int64_t k = 0; k < r->n; k++) {
      const Ev *e = &r->ev[k];
      const char *name = str_of(r, e->name), *cat = str_of(r, e->cat), *group = str_of(r, e->group);
      double d = e->t1 - e->t0;
      int tid = e->track > 0 && e->track < PROF_NTRACKS ? e->track : 2;
      if (!name) continue;
      if (tid == PROF_STEP && cat && !strcmp(cat, "step")) {
        step_total += d;
        steps++;
        continue;
      }
      Row *w = tid == PROF_COMM ? row_of(&comm, &nc, &cc, track_names[tid], name, group)
                                : row_of(&rows, &nr, &cr, track_names[tid], name, NULL);
      if (!w) continue;
      w->calls++;
      w->total += d;
      w->bytes += e->bytes;
      w->flops += e->flops;
    }
  }
  /* the collectives' share of the step time is in the first table too */
  for (int i = 0; i < nc; i++) {
    Row *w = row_of(&rows, &nr, &cr, comm[i].track, comm[i].name, NULL);
    if (!w) continue;
    w->calls += comm[i].calls;
    w->total += comm[i].total;
    w->bytes += comm[i].bytes;
  }
  if (rows) qsort(rows, (size_t)nr, sizeof *rows, row_cmp);
  if (comm) qsort(comm, (size_t)nc, sizeof *comm, row_cmp);
  fprintf(f, "hpdlrun: profile: %" PRId64 " step spans over %d rank%s, %.1f ms of step time in all%s\n", steps, n, n == 1 ? "" : "s",
          step_total * 1e3, dropped ? " (some events were dropped: the totals below are short)" : "");
  fprintf(f, "  %-8s %-28s %8s %12s %10s %7s  %s\n", "track", "phase / op", "calls", "total ms", "mean ms", "share", "achieved");
  for (int i = 0; i < nr && i < nrows; i++) {
    /* what the op reached: FLOP/s where its events carry FLOPs, else the
     * bytes it moved a second (kernels, collectives); phases and spans
     * carry neither */
    char rate[32] = "-";
    const Row *w = &rows[i];
    if (w->total > 0 && w->flops > 0) snprintf(rate, sizeof rate, "%.1f GFLOP/s", w->flops / w->total / 1e9);
    else if (w->total > 0 && w->bytes > 0) snprintf(rate, sizeof rate, "%.2f GB/s", (double)w->bytes / w->total / 1e9);
    fprintf(f, "  %-8s %-28.28s %8" PRId64 " %12.3f %10.4f %6.1f%%  %s\n", w->track, w->name, w->calls, w->total * 1e3,
            w->total * 1e3 / (double)w->calls, step_total > 0 ? 100.0 * w->total / step_total : 0.0, rate);
  }
  if (nr > nrows) fprintf(f, "  (%d more rows in the trace)\n", nr - nrows);
  if (nc) {
    fprintf(f, "hpdlrun: profile: collectives and messages (bytes of the buffer each call moves; GB/s = bytes / time)\n");
    fprintf(f, "  %-16s %-6s %8s %14s %12s %10s\n", "kind", "group", "calls", "bytes", "total ms", "GB/s");
    for (int i = 0; i < nc; i++) {
      /* slow links (a sanitized build, ranks sharing two cores) move well under 1 MB/s:
       * more decimals than 3, so that a rate is not printed as 0 */
      double gbs = comm[i].total > 0 ? (double)comm[i].bytes / comm[i].total / 1e9 : 0.0;
      fprintf(f, "  %-16s %-6s %8" PRId64 " %14" PRId64 " %12.3f %10.*f\n", comm[i].name, comm[i].group ? comm[i].group : "-",
              comm[i].calls, comm[i].bytes, comm[i].total * 1e3, gbs >= 0.01 ? 3 : 6, gbs);
    }
  }
  fprintf(f, "hpdlrun: profile: peak memory (resident set, getrusage) per rank\n");
  fprintf(f, "  %-6s %-24s %12s %10s %10s\n", "rank", "coords", "peak MiB", "events", "dropped");
  for (int i = 0; i < n; i++) {
    const ProfRank *r = ranks[i];
    char co[64];
    snprintf(co, sizeof co, "dp %d, tp %d, pp %d, cp %d", r->who.dp, r->who.tp, r->who.pp, r->who.cp);
    fprintf(f, "  %-6d %-24s %12.1f %10" PRId64 " %10" PRId64 "\n", r->who.rank, co, (double)r->who.peak_rss / 1048576.0, r->n, r->dropped);
  }
  free(rows);
  free(comm);
}
