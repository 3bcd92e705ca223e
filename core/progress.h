/* progress.h - one line of progress for long work (hpdlc compile, plan
 * --search): redrawn in place on a terminal, a line per phase in a log, or
 * nothing.
 *
 *   auto   on a terminal (the stream is a tty and TERM is not "dumb"), the
 *          redrawn line, but only once the work has taken PROGRESS_DELAY_S:
 *          a quick command prints nothing; elsewhere nothing
 *   tty    the redrawn line from the start (\r, erase to the end of line),
 *          at most every PROGRESS_REDRAW_S; cleared when done
 *   plain  a line for each new phase (progress_phase), none for counts
 *   quiet  nothing */
#ifndef HPDL_PROGRESS_H
#define HPDL_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef enum { PROGRESS_AUTO, PROGRESS_TTY, PROGRESS_PLAIN, PROGRESS_QUIET } ProgressMode;

#define PROGRESS_DELAY_S 0.5
#define PROGRESS_REDRAW_S 0.1

typedef struct Progress Progress;

/* "auto", "tty", "plain", "quiet"; -1 when unknown. */
int progress_mode_parse(const char *s);

/* A reporter writing to `f` prefixed by `who` ("hpdlc compile"); NULL
 * (which every function accepts) when the mode resolves to nothing. */
Progress *progress_start(ProgressMode mode, FILE *f, const char *who);

/* A new phase ("stage 2/8: kernels (NVRTC)"): shown at once (plain: a
 * line; tty: redrawn, throttled). */
void progress_phase(Progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Progress within the phase ("12840 layouts"): tty only, throttled, so it
 * may be called in a tight loop. */
void progress_count(Progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears the line (tty) before other output on the same stream; the next
 * update draws it again. */
void progress_clear(Progress *p);

/* Clears the line (tty) and frees the reporter. */
void progress_end(Progress *p);

#endif
