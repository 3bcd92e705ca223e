/* emustream.c - the emulated device's streams, run in order or held late
 * (emustream.h). A held stream is a FIFO of closures; draining it runs them
 * in order. The process's queues are kept in one list, so a pointer a test
 * double is handed back is recognised without being trusted. */
#include "emustream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct EmusWork {
  EmusRun run;
  void *arg;
  struct EmusWork *next;
} EmusWork;

typedef struct EmusQueue {
  EmusWork *head, *tail;
  struct EmusQueue *next;
  int failed; /* held work failed: said at the next drain */
  char msg[512];
} EmusQueue;

static EmusMode mode;
static EmusQueue *queues;      /* every queue of the process */
static EmusQueue launch_queue; /* the launch stream's, under launch-late */
static char side_name;         /* what a second stream is when it holds nothing */

int emus_mode_of(const char *text, EmusMode *m) {
  if (!text || !*text || !strcmp(text, "order")) *m = EMUS_ORDER;
  else if (!strcmp(text, "side-late")) *m = EMUS_SIDE_LATE;
  else if (!strcmp(text, "launch-late")) *m = EMUS_LAUNCH_LATE;
  else return -1;
  return 0;
}

const char *emus_mode_name(EmusMode m) {
  return m == EMUS_SIDE_LATE ? "side-late" : m == EMUS_LAUNCH_LATE ? "launch-late" : "order";
}

static int listed(const EmusQueue *q) {
  for (EmusQueue *e = queues; e; e = e->next)
    if (e == q) return 1;
  return 0;
}

void emus_set_mode(EmusMode m) {
  mode = m;
  if (m == EMUS_LAUNCH_LATE && !listed(&launch_queue)) {
    launch_queue.next = queues;
    queues = &launch_queue;
  }
}

EmusMode emus_mode(void) { return mode; }

/* The queue that holds work given to stream now, or NULL. */
static EmusQueue *queue_of(void *stream) {
  if (!stream) return mode == EMUS_LAUNCH_LATE ? &launch_queue : NULL;
  if (mode != EMUS_SIDE_LATE) return NULL;
  for (EmusQueue *e = queues; e; e = e->next)
    if (e == stream && e != &launch_queue) return e;
  return NULL;
}

void *emus_create(void) {
  if (mode != EMUS_SIDE_LATE) return &side_name;
  EmusQueue *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->next = queues;
  queues = q;
  return q;
}

static int drain_queue(EmusQueue *q, char *msg, size_t len) {
  while (q->head) {
    EmusWork *w = q->head;
    q->head = w->next;
    if (!q->head) q->tail = NULL;
    if (w->run(w->arg, q->msg, sizeof q->msg)) q->failed = 1;
    free(w->arg);
    free(w);
  }
  if (!q->failed) return 0;
  q->failed = 0;
  snprintf(msg, len, "work held on a stream failed: %s", q->msg);
  return -1;
}

int emus_destroy(void *stream, char *msg, size_t len) {
  EmusQueue *q = stream ? queue_of(stream) : NULL;
  if (!q) return 0;
  int rc = drain_queue(q, msg, len);
  for (EmusQueue **p = &queues; *p; p = &(*p)->next)
    if (*p == q) {
      *p = q->next;
      break;
    }
  free(q);
  return rc;
}

int emus_holds(void *stream) { return queue_of(stream) != NULL; }

int emus_hold(void *stream, EmusRun run, void *arg) {
  EmusQueue *q = queue_of(stream);
  EmusWork *w = q ? calloc(1, sizeof *w) : NULL;
  if (!w) return -1;
  w->run = run;
  w->arg = arg;
  if (q->tail) q->tail->next = w;
  else q->head = w;
  q->tail = w;
  return 0;
}

int emus_drain(void *stream, char *msg, size_t len) {
  EmusQueue *q = queue_of(stream);
  return q ? drain_queue(q, msg, len) : 0;
}

int emus_drain_all(char *msg, size_t len) {
  int rc = 0;
  /* held work may hold more only on its own stream (a test double's call
   * runs, it does not queue), so one pass empties every queue */
  for (EmusQueue *e = queues; e; e = e->next)
    if (drain_queue(e, msg, len)) rc = -1;
  return rc;
}

int hpdl_emu_defer(void *stream, EmusRun run, void *arg) { return emus_holds(stream) && emus_hold(stream, run, arg) == 0; }

int hpdl_emu_drain(void *stream) {
  char msg[600];
  if (emus_drain(stream, msg, sizeof msg)) return fprintf(stderr, "emulated device: %s\n", msg), -1;
  return 0;
}
