/* schedule.h - pipeline schedules as explicit per-rank instruction lists,
 * and a simulator that executes them.
 *
 * A pipeline of pp ranks trains a model cut into pp * v consecutive chunks.
 * Chunk c lives on rank c % pp: with v = 1 rank r holds chunk r (one stage
 * per rank); with v > 1 rank r holds chunks r, r + pp, r + 2 pp, ... (the
 * interleaved assignment of Narayanan et al. 2021, "Efficient Large-Scale
 * Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
 * Sec. 2.2.2). A step runs m micro-batches through every chunk forward and
 * backward, then synchronises gradients over data parallelism and steps the
 * optimizer.
 *
 * The schedules (why each exists):
 *   GPipe (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural
 *     Networks using Pipeline Parallelism"): every forward, then every
 *     backward. Simplest; every rank holds the activations of all m
 *     micro-batches at the turn.
 *   1F1B (PipeDream-Flush, Narayanan et al. 2021 Sec. 2.2.1): rank r runs
 *     pp - r - 1 warm-up forwards, then alternates one forward and one
 *     backward, then drains the remaining backwards. Same bubble as GPipe,
 *     (pp-1)(t_f + t_b) per rank, but at most pp - r micro-batches in flight.
 *   Interleaved 1F1B (Narayanan et al. 2021 Sec. 2.2.2): 1F1B over v chunks
 *     per rank, in Megatron-LM's order (forward_backward_pipelining_with_
 *     interleaving): micro-batches go through a rank's chunks in groups of
 *     pp; the bubble shrinks to (pp-1)(t_f + t_b)/v for v times as many
 *     point-to-point messages. Needs m % pp == 0, as Megatron does.
 *
 * The instruction lists are what a rank executes, in order: the simulated
 * ranks (sim.c) and the CPU program (runtime/program_exec.c, from the list
 * hpdlc compile records in each chunk file) run FWD / BWD as the forward
 * and backward parts of the chunk's step (IrGraph.fb_split), the transfers
 * being the step's own send / receive nodes; `hpdlc emit schedule` prints
 * them, the planner prices them with the simulator (bubble, micro-batches
 * in flight). */
#ifndef HPDL_SCHEDULE_H
#define HPDL_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

#include "semtypes.h" /* Schedule: SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED */

typedef enum {
  SCHED_OP_FWD,       /* forward of (chunk, mb) */
  SCHED_OP_BWD,       /* backward of (chunk, mb) */
  SCHED_OP_SEND_ACT,  /* send the output activation of (chunk, mb) to peer */
  SCHED_OP_RECV_ACT,  /* receive the output activation of (chunk, mb) from peer */
  SCHED_OP_SEND_GRAD, /* send the input gradient that BWD(chunk, mb) made to peer */
  SCHED_OP_RECV_GRAD, /* receive the input gradient of (chunk, mb) from peer */
  SCHED_OP_REDUCE_GRADS,   /* data-parallel gradient sync point (all-reduce / reduce-scatter) */
  SCHED_OP_OPTIMIZER_STEP  /* the optimizer update */
} SchedOp;

/* One instruction. Messages are named by the chunk that produced them:
 * SEND_ACT(to, c, mb) on rank c % pp pairs with RECV_ACT(from, c, mb) on
 * rank (c+1) % pp, which then runs FWD(c+1, mb); SEND_GRAD(to, c, mb) on
 * rank c % pp pairs with RECV_GRAD(from, c, mb) on rank (c-1) % pp, which
 * then runs BWD(c-1, mb). chunk, mb and peer are -1 where they do not apply
 * (peer for FWD / BWD; all three for REDUCE_GRADS and OPTIMIZER_STEP). */
typedef struct SchedInstr {
  SchedOp op;
  int chunk, mb, peer;
} SchedInstr;

/* The program of one pipeline: per rank, an ordered instruction list. */
typedef struct SchedProgram {
  Schedule kind;
  int pp, m, v;   /* ranks, micro-batches per step, chunks per rank */
  int chunks;     /* pp * v */
  int *len, *cap; /* per rank */
  SchedInstr **ins; /* per rank: ins[r][0 .. len[r]-1] */
} SchedProgram;

const char *sched_op_name(SchedOp op); /* "FWD", "SEND_ACT", ... */

/* Rank that holds model chunk c: c % pp (Megatron's interleaved assignment;
 * the identity when v = 1). */
int sched_chunk_rank(int pp, int chunk);

/* Forwards rank `rank` runs before its first backward (the warm-up), as
 * Megatron-LM computes it: GPipe m; 1F1B min(pp - rank - 1, m); interleaved
 * min((pp - rank - 1) * 2 + (v - 1) * pp, m v), except that m == pp runs all
 * m v forwards first (Megatron's all_warmup_microbatches case). -1 for
 * arguments sched_build rejects. */
int sched_warmup(Schedule kind, int pp, int m, int v, int rank);

/* Checks the arguments: pp, m, v >= 1; v == 1 unless interleaved; interleaved
 * needs v >= 2 and m % pp == 0. Returns 0, or -1 with a message in err. */
int sched_validate_args(Schedule kind, int pp, int m, int v, char *err, size_t errlen);

/* Builds the instruction lists. Each rank's list is its compute order (see
 * the schedules above) with a RECV placed right before the FWD / BWD that
 * needs it and a SEND right after the FWD / BWD that produced it (no message
 * where both chunks are on one rank, i.e. pp == 1), then REDUCE_GRADS and
 * OPTIMIZER_STEP. Returns 0, or -1 with a message in err (out is then
 * empty and needs no sched_free). */
int sched_build(SchedProgram *out, Schedule kind, int pp, int m, int v, char *err, size_t errlen);

/* The order of one micro-batch in flight: micro-batch by micro-batch, its
 * forward through every chunk, then its backward back (FWD / BWD only, no
 * messages or reduce). Valid for every pp, m, v >= 1 (even where
 * sched_build rejects the shape: interleaving with m % pp != 0); what the
 * executors ran before they ran schedules. 0, or -1 when out of memory. */
int sched_build_sequential(SchedProgram *out, int pp, int m, int v);

/* Stage r's instruction list for m micro-batches, as the executors run it:
 * `recorded` (nrecorded instructions for recorded_m micro-batches, what
 * hpdlc compile wrote) when it is for m, else sched_build's for `kind`,
 * and the sequential order where that shape cannot be built or
 * sequential_only asks for it. malloc'd, *n its length; NULL when memory
 * runs out. */
SchedInstr *sched_stage_list(Schedule kind, int pp, int m, int v, int r, const SchedInstr *recorded, int nrecorded,
                             int recorded_m, int sequential_only, int *n);

/* An empty program of that shape (no argument checks beyond pp, m, v >= 1),
 * to which sched_push appends: for hand-written and mutated programs in
 * tests. Both return 0, or -1 when out of memory or out of range. */
int sched_init(SchedProgram *out, Schedule kind, int pp, int m, int v);
int sched_push(SchedProgram *p, int rank, SchedOp op, int chunk, int mb, int peer);
void sched_free(SchedProgram *p);

/* Structural check, independent of order: each (chunk, mb) has exactly one
 * FWD and one BWD, on rank chunk % pp; every message crossing ranks is sent
 * exactly once by its producer and received exactly once by its consumer,
 * with matching peers, and there is none between chunks on one rank; every
 * rank ends with REDUCE_GRADS then OPTIMIZER_STEP, once each. Order
 * (deadlock) is the simulator's business. Returns 0, or -1 with the first
 * problem in err. */
int sched_check(const SchedProgram *p, char *err, size_t errlen);

/* Peak number of (chunk, micro-batch) activation sets rank `rank` holds:
 * the maximum over its list of FWDs done minus BWDs done. In units of one
 * chunk's activations of one micro-batch (with v = 1: micro-batches); the
 * planner multiplies by that. GPipe m; 1F1B min(pp - rank, m); interleaved
 * min(warm-up + 1, m v). */
int sched_peak_inflight(const SchedProgram *p, int rank);

/* ---- printing ----
 * A stable text form, one line per rank, for golden tests and
 * `hpdlc emit schedule`:
 *   schedule 1f1b pp=2 m=2 v=1
 *   rank 0: F0.0 sa0.0>1 F0.1 sa0.1>1 rg1.0<1 B0.0 rg1.1<1 B0.1 reduce step
 *   rank 1: ra0.0<0 F1.0 sg1.0>0 ...
 * F<c>.<mb> / B<c>.<mb> forward / backward; sa / ra send / receive an
 * activation, sg / rg a gradient, named <chunk>.<mb> by the chunk that
 * produced it, ">r" to rank r, "<r" from rank r; reduce = REDUCE_GRADS,
 * step = OPTIMIZER_STEP. SCHED_PRINT_COMPUTE prints only F and B (the
 * pictures of the papers). */
enum { SCHED_PRINT_COMPUTE = 1u };
/* One instruction in that form into buf (always NUL-terminated); returns
 * what snprintf returns. */
int sched_format_instr(char *buf, size_t n, const SchedInstr *in);
void sched_print(FILE *f, const SchedProgram *p, unsigned flags);

/* ---- simulation ----
 *
 * Execution model (why: it is the one the bubble formulas of Narayanan et al.
 * 2021 Sec. 2.2 and Huang et al. 2019 assume, with the transfer latency
 * added):
 *   - each rank executes its list in order, one instruction at a time, from
 *     time 0;
 *   - FWD(c, mb) waits for the activation of (c-1, mb): FWD(c-1, mb) done on
 *     this rank, or RECV_ACT of (c-1, mb) done here; BWD(c, mb) waits for
 *     FWD(c, mb) on this rank and, unless c is the last chunk, for the
 *     gradient of (c+1, mb) (BWD(c+1, mb) here, or RECV_GRAD here);
 *   - a SEND waits for the FWD / BWD whose result it carries and takes no
 *     rank time (an asynchronous send on a communication stream, as
 *     Megatron's batched isend/irecv); the message arrives t_p2p later;
 *   - a RECV completes when its message has arrived (no rank time of its
 *     own; the wait is idle time);
 *   - REDUCE_GRADS and OPTIMIZER_STEP take t_reduce and t_optimizer of the
 *     rank (no cross-rank synchronisation: the data-parallel all-reduce is
 *     among the replicas of one stage, not along the pipeline).
 * A state in which no rank can execute its next instruction and some rank
 * has not finished is a deadlock; it is reported, never looped on. */

typedef struct SchedCosts {
  double t_fwd, t_bwd;       /* one chunk, one micro-batch */
  const double *fwd, *bwd;   /* optional per-chunk times (chunks entries); override t_fwd / t_bwd */
  double t_p2p;              /* latency of one activation or gradient message */
  double t_reduce, t_optimizer;
} SchedCosts;

/* One executed instruction. FWD, BWD, REDUCE_GRADS, OPTIMIZER_STEP: the rank
 * computes during [start, end]. RECV_*: [start, end] is the wait from
 * reaching the instruction to the data's arrival. SEND_*: [start, end] is
 * the transfer on the link (the rank is free). A Chrome trace draws the
 * first kind on the rank's track and the others on its communication
 * track. */
typedef struct SchedEvent {
  int rank;
  SchedOp op;
  int chunk, mb, peer;
  double start, end;
} SchedEvent;

typedef struct SchedSim {
  int deadlock;         /* 1: stopped, no rank could progress */
  char message[512];    /* on deadlock: where each unfinished rank is stuck */
  int pp;
  double makespan;      /* last end over every rank */
  double *busy;         /* per rank: time computing (FWD, BWD, REDUCE_GRADS, OPTIMIZER_STEP) */
  double *idle;         /* per rank: makespan - busy */
  double *compute;      /* per rank: FWD + BWD time only */
  int *peak_inflight;   /* per rank: peak (chunk, mb) activation sets held, FWD start to BWD end */
  int *stuck_at;        /* per rank: index of the instruction it is blocked at, -1 if finished */
  double busy_total, idle_total;
  /* Bubble as the papers define it, averaged over ranks:
   *   bubble_fraction = idle_total / (pp * makespan): the share of the step
   *     a rank idles; compare cost_bubble_step_fraction, (pp-1)/(m+pp-1)
   *     for GPipe and 1F1B.
   *   bubble_ratio = idle_total / busy_total: the overhead over the ideal
   *     time; compare cost_bubble_fraction, (pp-1)/m, resp. (pp-1)/(v m). */
  double bubble_fraction, bubble_ratio;
  SchedEvent *events;   /* the executed instructions, rank by rank, in list order */
  int n_events;
} SchedSim;

/* Simulates with uniform per-chunk times (t_fwd, t_bwd: one chunk, one
 * micro-batch; with v chunks per rank a stage's time is v times that) and
 * free reduce / optimizer. Returns 0; 1 on deadlock (out filled up to that
 * point, out->deadlock set); -1 on bad arguments or out of memory (out
 * zeroed). Free out with sched_sim_free in the first two cases. */
int sched_simulate(const SchedProgram *p, double t_fwd, double t_bwd, double t_p2p, SchedSim *out);
int sched_simulate_costs(const SchedProgram *p, const SchedCosts *costs, SchedSim *out);
void sched_sim_free(SchedSim *s);

/* A readable summary: makespan, bubble, per-rank busy / idle / peak. */
void sched_print_sim(FILE *f, const SchedSim *s);

#endif
