/* progress.c - see progress.h. */
#include "progress.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct Progress {
  FILE *f;
  ProgressMode mode; /* TTY or PLAIN once started */
  double t0, last, delay;
  int drawn;         /* a tty line is on the screen */
  char who[64];
  char phase[200];
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int progress_mode_parse(const char *s) {
  static const char *const names[] = {"auto", "tty", "plain", "quiet"};
  for (int i = 0; i < 4; i++)
    if (!strcmp(s, names[i])) return i;
  return -1;
}

Progress *progress_start(ProgressMode mode, FILE *f, const char *who) {
  double delay = 0;
  if (mode == PROGRESS_AUTO) {
    const char *term = getenv("TERM");
    if (!f || !isatty(fileno(f)) || (term && !strcmp(term, "dumb"))) return NULL;
    mode = PROGRESS_TTY;
    delay = PROGRESS_DELAY_S;
  }
  if (mode == PROGRESS_QUIET || !f) return NULL;
  Progress *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->f = f;
  p->mode = mode;
  p->t0 = now_s();
  p->last = -1;
  p->delay = delay;
  snprintf(p->who, sizeof p->who, "%s", who ? who : "");
  return p;
}

static void draw(Progress *p, const char *detail, int force) {
  double t = now_s();
  if (t - p->t0 < p->delay) return;
  if (!force && p->last >= 0 && t - p->last < PROGRESS_REDRAW_S) return;
  p->last = t;
  fprintf(p->f, "\r\033[K%s: %s%s%s (%.1f s)", p->who, p->phase, detail && *detail ? ": " : "", detail ? detail : "", t - p->t0);
  fflush(p->f);
  p->drawn = 1;
}

void progress_phase(Progress *p, const char *fmt, ...) {
  if (!p) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->phase, sizeof p->phase, fmt, ap);
  va_end(ap);
  if (p->mode == PROGRESS_PLAIN) {
    fprintf(p->f, "%s: %s (%.1f s)\n", p->who, p->phase, now_s() - p->t0);
    fflush(p->f);
  } else
    draw(p, NULL, 0);
}

void progress_count(Progress *p, const char *fmt, ...) {
  if (!p || p->mode != PROGRESS_TTY) return;
  /* the clock first: most calls in a tight loop end here */
  double t = now_s();
  if (t - p->t0 < p->delay || (p->last >= 0 && t - p->last < PROGRESS_REDRAW_S)) return;
  char detail[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  draw(p, detail, 1);
}

void progress_clear(Progress *p) {
  if (!p || !p->drawn) return;
  fputs("\r\033[K", p->f);
  fflush(p->f);
  p->drawn = 0;
  p->last = -1;
}

void progress_end(Progress *p) {
  if (!p) return;
  if (p->drawn) {
    fputs("\r\033[K", p->f);
    fflush(p->f);
  }
  free(p);
}
