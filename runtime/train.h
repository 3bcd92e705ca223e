/* train.h - the training loop and the interface of the program it runs.
 *
 * The loop is the runtime's; the program computes gradients. Per step:
 *   fetch the step's micro-batches (data.h) -> zero the gradients ->
 *   program->step (forward and backward of every micro-batch, with its own
 *   tensor / pipeline / context collectives) -> data-parallel all-reduce of
 *   the gradients (compressed when the layout asks) unless the program does
 *   it itself -> global gradient norm and clipping -> optimizer update ->
 *   loss agreed over the ranks -> metrics, log line -> checkpoint.
 *
 * Programs: `hpdlc compile` emits one per rank as a shared object exporting
 * TRAIN_PROGRAM_SYMBOL (docs/runtime.md, "The program interface"; its
 * types are program.h); tests and demos without a compiler use the builtin
 * ones (builtin.h). */
#ifndef HPDL_TRAIN_H
#define HPDL_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "artifact.h"
#include "comm.h"
#include "data.h"
#include "program.h"
#include "rt.h"

typedef enum { TRAIN_PROGRESS_AUTO, TRAIN_PROGRESS_TTY, TRAIN_PROGRESS_PLAIN, TRAIN_PROGRESS_QUIET } TrainProgress;

typedef struct {
  int64_t steps;           /* -1: the artifact's */
  int64_t stop_at;         /* > 0: stop after this step; the schedule still spans `steps` */
  const char *data;        /* NULL: the artifact's */
  int64_t seed;            /* -1: the artifact's */
  int64_t log_every;       /* -1: the artifact's */
  const char *ckpt_dir;    /* NULL: the artifact's (a checkpoint needs a folder) */
  int64_t ckpt_every;      /* -1: the artifact's */
  int64_t ckpt_keep;       /* -1: the artifact's */
  int ckpt_async;          /* -1: the artifact's */
  int resume;              /* resume from the latest checkpoint in ckpt_dir */
  const char *resume_from; /* or from this manifest / folder */
  const char *init_from;   /* the parameters' starting values from this safetensors file (step 0, no optimizer state) */
  const char *metrics;     /* JSON lines, one per step */
  TrainProgress progress;
  int tty;                 /* for AUTO: whether the user's terminal is one */
  FILE *out;               /* rank 0's log (stdout) */
  const char *threads;     /* for the header: "2 threads per rank"; NULL: not shown */
  int nthreads;            /* the rank's threads for the norm, clipping and update passes; 0: 1 */
  const char *device;      /* --target cuda artifacts: "cuda" (NULL) or "emulate" */
  const char *profile;     /* --profile FILE: the Chrome trace of every rank, written by rank 0 at the end */
  int64_t profile_cap;     /* events kept per rank (<= 0: PROF_DEFAULT_CAP) */
  /* --eval-every N: after every N-th step and the last, the validation loss
   * over eval_steps steps of eval_data (NULL: the training data's pattern
   * with _train_ read as _val_), the model in evaluation mode; 0: never */
  int64_t eval_every;
  int64_t eval_steps;      /* <= 0: 10 */
  const char *eval_data;
} TrainOptions;

typedef struct {
  int64_t first_step, last_step; /* steps run: first_step .. last_step-1 */
  int64_t total_steps;
  double first_loss, last_loss, seconds, tokens_per_s;
  char last_checkpoint[4096];
  int stop_status;       /* stopped early by a signal (rt.h): 143 or 130; 0 when not */
  int stop_via_launcher; /* the signal came through hpdlrun's launcher, which reports it */
} TrainSummary;

void train_options_defaults(TrainOptions *o);

/* Runs the job on this rank. Every rank returns the same status: an error
 * any rank meets while setting up is agreed on (and reported by the rank
 * that met it, into *e; *reporter says whether this rank should print it). */
int train_run(const Artifact *a, Comm *comm, const TrainOptions *o, TrainSummary *sum, int *reporter, RtErr *e);

#endif
