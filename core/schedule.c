/* schedule.c - pipeline schedules as per-rank instruction lists, their
 * structural check, printer and simulator (see schedule.h).
 *
 * Sources: Huang et al. 2019 (GPipe) for all-forward-then-all-backward;
 * Narayanan et al. 2021 (Megatron-LM, SC'21) Sec. 2.2.1 for 1F1B
 * (PipeDream-Flush) and Sec. 2.2.2 for the interleaved schedule, whose
 * order follows Megatron-LM's forward_backward_pipelining_with_interleaving. */
#include "schedule.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t n, const char *fmt, ...) {
  if (!err || n == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
}

const char *sched_op_name(SchedOp op) {
  switch (op) {
  case SCHED_OP_FWD: return "FWD";
  case SCHED_OP_BWD: return "BWD";
  case SCHED_OP_SEND_ACT: return "SEND_ACT";
  case SCHED_OP_RECV_ACT: return "RECV_ACT";
  case SCHED_OP_SEND_GRAD: return "SEND_GRAD";
  case SCHED_OP_RECV_GRAD: return "RECV_GRAD";
  case SCHED_OP_REDUCE_GRADS: return "REDUCE_GRADS";
  case SCHED_OP_OPTIMIZER_STEP: return "OPTIMIZER_STEP";
  }
  return "?";
}

static const char *kind_name(Schedule k) {
  return k == SCHED_GPIPE || k == SCHED_1F1B || k == SCHED_INTERLEAVED ? sem_schedule_name(k) : "?";
}

/* Megatron's interleaved assignment: rank r holds chunks r, r+pp, ...; so
 * consecutive chunks are always on different ranks when pp > 1, and a
 * micro-batch visits every rank v times. */
int sched_chunk_rank(int pp, int chunk) { return pp > 0 && chunk >= 0 ? chunk % pp : -1; }

int sched_validate_args(Schedule kind, int pp, int m, int v, char *err, size_t errlen) {
  if (kind != SCHED_GPIPE && kind != SCHED_1F1B && kind != SCHED_INTERLEAVED) {
    set_err(err, errlen, "unknown pipeline schedule %d", (int)kind);
    return -1;
  }
  if (pp < 1 || m < 1 || v < 1) {
    set_err(err, errlen, "pipeline schedule needs pp, m, v >= 1 (got pp=%d m=%d v=%d)", pp, m, v);
    return -1;
  }
  if (kind != SCHED_INTERLEAVED && v != 1) {
    set_err(err, errlen, "virtual stages (v=%d) need the interleaved schedule, not %s", v, kind_name(kind));
    return -1;
  }
  if (kind == SCHED_INTERLEAVED && v < 2) {
    set_err(err, errlen, "the interleaved schedule needs v >= 2 virtual stages (got %d)", v);
    return -1;
  }
  /* Megatron groups micro-batches by pp per chunk; a partial group has no
   * defined order (schedules.py asserts the same). */
  if (kind == SCHED_INTERLEAVED && m % pp != 0) {
    set_err(err, errlen, "the interleaved schedule needs m (%d) divisible by pp (%d)", m, pp);
    return -1;
  }
  /* The instruction count is about 6 m v per rank; keep it an int. */
  if ((long long)m * v > 100000000LL || (long long)pp * v > 1000000LL) {
    set_err(err, errlen, "pipeline schedule too large (pp=%d m=%d v=%d)", pp, m, v);
    return -1;
  }
  return 0;
}

int sched_warmup(Schedule kind, int pp, int m, int v, int rank) {
  if (sched_validate_args(kind, pp, m, v, NULL, 0) != 0 || rank < 0 || rank >= pp) return -1;
  int total = m * v;
  switch (kind) {
  case SCHED_GPIPE: return total; /* Huang et al. 2019: all forwards first */
  case SCHED_1F1B: {
    /* Narayanan et al. 2021 Sec. 2.2.1: rank r must have pp - r - 1
     * micro-batches ahead of it before the first backward reaches it. */
    int w = pp - rank - 1;
    return w < total ? w : total;
  }
  case SCHED_INTERLEAVED: {
    /* Megatron-LM: (v-1) pp forwards fill the first v-1 chunks of every
     * rank, 2 (pp - r - 1) more let the first backward come back round;
     * with exactly pp micro-batches it runs every forward first. */
    if (m == pp) return total;
    long long w = (long long)(pp - rank - 1) * 2 + (long long)(v - 1) * pp;
    return w < total ? (int)w : total;
  }
  }
  return -1;
}

/* The k-th forward (or backward) of a rank, k in 0 .. m v - 1, in Megatron's
 * order: k counts through groups of pp v; within a group, pp micro-batches
 * per chunk, chunks ascending for forwards and descending for backwards; the
 * micro-batches of one chunk run first in, first out (input_tensors[chunk]
 * is a queue). With v = 1 this is simply micro-batch k. */
static int local_chunk_of(int k, int pp, int v, int forward) {
  int lc = (k % (pp * v)) / pp;
  return forward ? lc : v - 1 - lc;
}
static int mb_of(int k, int pp, int v) { return (k / (pp * v)) * pp + k % pp; }

/* ---- program storage ---- */

int sched_init(SchedProgram *out, Schedule kind, int pp, int m, int v) {
  memset(out, 0, sizeof *out);
  if (pp < 1 || m < 1 || v < 1) return -1;
  out->kind = kind;
  out->pp = pp;
  out->m = m;
  out->v = v;
  out->chunks = pp * v;
  out->len = calloc((size_t)pp, sizeof *out->len);
  out->cap = calloc((size_t)pp, sizeof *out->cap);
  out->ins = calloc((size_t)pp, sizeof *out->ins);
  if (!out->len || !out->cap || !out->ins) {
    sched_free(out);
    return -1;
  }
  return 0;
}

void sched_free(SchedProgram *p) {
  if (!p) return;
  if (p->ins)
    for (int r = 0; r < p->pp; r++) free(p->ins[r]);
  free(p->ins);
  free(p->len);
  free(p->cap);
  memset(p, 0, sizeof *p);
}

SchedInstr *sched_stage_list(Schedule kind, int pp, int m, int v, int r, const SchedInstr *recorded, int nrecorded,
                             int recorded_m, int sequential_only, int *n) {
  SchedProgram prog;
  memset(&prog, 0, sizeof prog);
  const SchedInstr *src = recorded;
  int len = nrecorded;
  if (sequential_only || nrecorded <= 0 || recorded_m != m) {
    char why[256];
    if ((sequential_only || sched_build(&prog, kind, pp, m, v, why, sizeof why)) && sched_build_sequential(&prog, pp, m, v))
      return NULL;
    src = prog.ins[r];
    len = prog.len[r];
  }
  SchedInstr *out = malloc(sizeof(SchedInstr) * (size_t)(len > 0 ? len : 1));
  if (out && len > 0) memcpy(out, src, sizeof(SchedInstr) * (size_t)len);
  sched_free(&prog);
  *n = len;
  return out;
}

int sched_push(SchedProgram *p, int rank, SchedOp op, int chunk, int mb, int peer) {
  if (!p || !p->ins || rank < 0 || rank >= p->pp) return -1;
  if (p->len[rank] == p->cap[rank]) {
    int nc = p->cap[rank] ? p->cap[rank] * 2 : 16;
    SchedInstr *n = realloc(p->ins[rank], (size_t)nc * sizeof *n);
    if (!n) return -1;
    p->ins[rank] = n;
    p->cap[rank] = nc;
  }
  p->ins[rank][p->len[rank]++] = (SchedInstr){op, chunk, mb, peer};
  return 0;
}

/* One FWD or BWD with its messages around it: the RECV right before (the
 * rank cannot start without the data anyway), the SEND right after (the
 * result leaves as soon as it exists). No message between chunks on one
 * rank (pp == 1). */
static int emit_compute(SchedProgram *p, int r, int forward, int c, int mb) {
  int last = p->chunks - 1, pp = p->pp, rc = 0;
  if (forward) {
    if (c > 0 && sched_chunk_rank(pp, c - 1) != r)
      rc |= sched_push(p, r, SCHED_OP_RECV_ACT, c - 1, mb, sched_chunk_rank(pp, c - 1));
    rc |= sched_push(p, r, SCHED_OP_FWD, c, mb, -1);
    if (c < last && sched_chunk_rank(pp, c + 1) != r)
      rc |= sched_push(p, r, SCHED_OP_SEND_ACT, c, mb, sched_chunk_rank(pp, c + 1));
  } else {
    if (c < last && sched_chunk_rank(pp, c + 1) != r)
      rc |= sched_push(p, r, SCHED_OP_RECV_GRAD, c + 1, mb, sched_chunk_rank(pp, c + 1));
    rc |= sched_push(p, r, SCHED_OP_BWD, c, mb, -1);
    if (c > 0 && sched_chunk_rank(pp, c - 1) != r)
      rc |= sched_push(p, r, SCHED_OP_SEND_GRAD, c, mb, sched_chunk_rank(pp, c - 1));
  }
  return rc;
}

static int emit_kth(SchedProgram *p, int r, int forward, int k) {
  int c = local_chunk_of(k, p->pp, p->v, forward) * p->pp + r;
  return emit_compute(p, r, forward, c, mb_of(k, p->pp, p->v));
}

int sched_build(SchedProgram *out, Schedule kind, int pp, int m, int v, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (sched_validate_args(kind, pp, m, v, err, errlen) != 0) return -1;
  if (sched_init(out, kind, pp, m, v) != 0) {
    set_err(err, errlen, "out of memory");
    return -1;
  }
  int total = m * v, rc = 0;
  for (int r = 0; r < pp && rc == 0; r++) {
    /* One loop for the three schedules, Megatron's shape: warm-up
     * forwards, steady state of one forward then one backward, cool-down
     * backwards. GPipe is the case warm-up = m (no steady state), 1F1B the
     * case v = 1. */
    int w = sched_warmup(kind, pp, m, v, r);
    int steady = total - w;
    for (int k = 0; k < w; k++) rc |= emit_kth(out, r, 1, k);
    for (int i = 0; i < steady; i++) {
      rc |= emit_kth(out, r, 1, w + i);
      rc |= emit_kth(out, r, 0, i);
    }
    for (int k = steady; k < total; k++) rc |= emit_kth(out, r, 0, k);
    /* The data-parallel gradient sync can only start once every backward
     * of the rank has accumulated into the gradients, and the optimizer
     * needs the synchronised gradients. */
    rc |= sched_push(out, r, SCHED_OP_REDUCE_GRADS, -1, -1, -1);
    rc |= sched_push(out, r, SCHED_OP_OPTIMIZER_STEP, -1, -1, -1);
  }
  if (rc != 0) {
    sched_free(out);
    set_err(err, errlen, "out of memory");
    return -1;
  }
  return 0;
}

/* ---- structural check ---- */

int sched_check(const SchedProgram *p, char *err, size_t errlen) {
  if (!p || !p->len || !p->ins || p->pp < 1 || p->m < 1 || p->v < 1 || p->chunks != p->pp * p->v) {
    set_err(err, errlen, "malformed schedule program");
    return -1;
  }
  int pp = p->pp, m = p->m, C = p->chunks;
  size_t n = (size_t)C * (size_t)m;
  /* counts per (chunk, mb) of FWD, BWD, SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD */
  int *cnt = calloc(6 * n, sizeof *cnt);
  if (!cnt) {
    set_err(err, errlen, "out of memory");
    return -1;
  }
  char tok[64];
  int bad = 0;
  for (int r = 0; r < pp && !bad; r++) {
    int L = p->len[r];
    if (L < 2 || p->ins[r][L - 2].op != SCHED_OP_REDUCE_GRADS || p->ins[r][L - 1].op != SCHED_OP_OPTIMIZER_STEP) {
      set_err(err, errlen, "rank %d: the list must end with reduce step", r);
      bad = 1;
      break;
    }
    for (int i = 0; i < L && !bad; i++) {
      const SchedInstr *in = &p->ins[r][i];
      sched_format_instr(tok, sizeof tok, in);
      if (in->op == SCHED_OP_REDUCE_GRADS || in->op == SCHED_OP_OPTIMIZER_STEP) {
        if (i < L - 2) {
          set_err(err, errlen, "rank %d: %s at #%d before the end", r, tok, i);
          bad = 1;
        }
        continue;
      }
      int c = in->chunk, mb = in->mb;
      if ((unsigned)in->op > (unsigned)SCHED_OP_OPTIMIZER_STEP || c < 0 || c >= C || mb < 0 || mb >= m) {
        set_err(err, errlen, "rank %d: #%d %s: chunk or micro-batch out of range", r, i, tok);
        bad = 1;
        break;
      }
      /* where the instruction must be and whom it must name */
      int want_rank = -1, want_peer = -1;
      switch (in->op) {
      case SCHED_OP_FWD:
      case SCHED_OP_BWD: want_rank = sched_chunk_rank(pp, c); break;
      case SCHED_OP_SEND_ACT:
        want_rank = sched_chunk_rank(pp, c);
        want_peer = c + 1 < C ? sched_chunk_rank(pp, c + 1) : -2;
        break;
      case SCHED_OP_RECV_ACT:
        want_rank = c + 1 < C ? sched_chunk_rank(pp, c + 1) : -2;
        want_peer = sched_chunk_rank(pp, c);
        break;
      case SCHED_OP_SEND_GRAD:
        want_rank = sched_chunk_rank(pp, c);
        want_peer = c > 0 ? sched_chunk_rank(pp, c - 1) : -2;
        break;
      case SCHED_OP_RECV_GRAD:
        want_rank = c > 0 ? sched_chunk_rank(pp, c - 1) : -2;
        want_peer = sched_chunk_rank(pp, c);
        break;
      default: break;
      }
      if (want_rank == -2 || want_peer == -2) {
        set_err(err, errlen, "rank %d: #%d %s: no such message (chunk %d has no %s neighbour)", r, i, tok, c,
                in->op == SCHED_OP_SEND_ACT || in->op == SCHED_OP_RECV_ACT ? "next" : "previous");
        bad = 1;
      } else if (want_rank != r) {
        set_err(err, errlen, "rank %d: #%d %s belongs on rank %d", r, i, tok, want_rank);
        bad = 1;
      } else if (in->op >= SCHED_OP_SEND_ACT && want_peer != in->peer) {
        set_err(err, errlen, "rank %d: #%d %s: the peer must be rank %d", r, i, tok, want_peer);
        bad = 1;
      } else if (in->op >= SCHED_OP_SEND_ACT && want_peer == r) {
        set_err(err, errlen, "rank %d: #%d %s: a message to itself (both chunks are on rank %d)", r, i, tok, r);
        bad = 1;
      }
      cnt[(size_t)in->op * n + (size_t)c * (size_t)m + (size_t)mb]++;
    }
  }
  /* every (chunk, mb) computed once each way; every crossing message sent
   * and received once */
  for (int c = 0; c < C && !bad; c++) {
    for (int mb = 0; mb < m && !bad; mb++) {
      size_t at = (size_t)c * (size_t)m + (size_t)mb;
      int next_cross = c + 1 < C && sched_chunk_rank(pp, c + 1) != sched_chunk_rank(pp, c);
      int prev_cross = c > 0 && sched_chunk_rank(pp, c - 1) != sched_chunk_rank(pp, c);
      const struct {
        SchedOp op;
        int want;
      } need[] = {{SCHED_OP_FWD, 1},
                  {SCHED_OP_BWD, 1},
                  {SCHED_OP_SEND_ACT, next_cross},
                  {SCHED_OP_RECV_ACT, next_cross},
                  {SCHED_OP_SEND_GRAD, prev_cross},
                  {SCHED_OP_RECV_GRAD, prev_cross}};
      for (size_t k = 0; k < sizeof need / sizeof need[0]; k++) {
        int got = cnt[(size_t)need[k].op * n + at];
        if (got != need[k].want) {
          set_err(err, errlen, "%s of chunk %d micro-batch %d appears %d times, expected %d",
                  sched_op_name(need[k].op), c, mb, got, need[k].want);
          bad = 1;
          break;
        }
      }
    }
  }
  free(cnt);
  return bad ? -1 : 0;
}

int sched_peak_inflight(const SchedProgram *p, int rank) {
  if (!p || rank < 0 || rank >= p->pp) return -1;
  int cur = 0, peak = 0;
  for (int i = 0; i < p->len[rank]; i++) {
    if (p->ins[rank][i].op == SCHED_OP_FWD && ++cur > peak) peak = cur;
    if (p->ins[rank][i].op == SCHED_OP_BWD) cur--;
  }
  return peak;
}

/* ---- printing ---- */

int sched_format_instr(char *buf, size_t n, const SchedInstr *in) {
  int c = in->chunk, mb = in->mb, q = in->peer;
  switch (in->op) {
  case SCHED_OP_FWD: return snprintf(buf, n, "F%d.%d", c, mb);
  case SCHED_OP_BWD: return snprintf(buf, n, "B%d.%d", c, mb);
  case SCHED_OP_SEND_ACT: return snprintf(buf, n, "sa%d.%d>%d", c, mb, q);
  case SCHED_OP_RECV_ACT: return snprintf(buf, n, "ra%d.%d<%d", c, mb, q);
  case SCHED_OP_SEND_GRAD: return snprintf(buf, n, "sg%d.%d>%d", c, mb, q);
  case SCHED_OP_RECV_GRAD: return snprintf(buf, n, "rg%d.%d<%d", c, mb, q);
  case SCHED_OP_REDUCE_GRADS: return snprintf(buf, n, "reduce");
  case SCHED_OP_OPTIMIZER_STEP: return snprintf(buf, n, "step");
  }
  return snprintf(buf, n, "?%d", (int)in->op);
}

void sched_print(FILE *f, const SchedProgram *p, unsigned flags) {
  fprintf(f, "schedule %s pp=%d m=%d v=%d\n", kind_name(p->kind), p->pp, p->m, p->v);
  char tok[64];
  for (int r = 0; r < p->pp; r++) {
    fprintf(f, "rank %d:", r);
    for (int i = 0; i < p->len[r]; i++) {
      const SchedInstr *in = &p->ins[r][i];
      if ((flags & SCHED_PRINT_COMPUTE) && in->op != SCHED_OP_FWD && in->op != SCHED_OP_BWD) continue;
      sched_format_instr(tok, sizeof tok, in);
      fprintf(f, " %s", tok);
    }
    fputc('\n', f);
  }
}

/* ---- simulation ---- */

/* What is known about one (chunk, mb): which rank did the FWD / BWD and
 * when it ended; which rank a message was sent to and when it arrives;
 * which rank received it and when. rank -1: not yet. */
typedef struct {
  int rank;
  double t;
} Done;

typedef struct {
  Done fwd, bwd;
  Done act_sent, act_recv; /* act_sent.rank: destination; act_sent.t: arrival */
  Done grad_sent, grad_recv;
  int act_from, grad_from;
} Slot;

typedef struct {
  const SchedProgram *p;
  const SchedCosts *k;
  Slot *slot;
  double *clock; /* per rank: when it is free */
  int *inflight;
  SchedSim *out;
} Sim;

static double dmax(double a, double b) { return a > b ? a : b; }

static double fwd_time(const Sim *s, int c) { return s->k->fwd ? s->k->fwd[c] : s->k->t_fwd; }
static double bwd_time(const Sim *s, int c) { return s->k->bwd ? s->k->bwd[c] : s->k->t_bwd; }

static Slot *slot_at(const Sim *s, int c, int mb) { return &s->slot[(size_t)c * (size_t)s->p->m + (size_t)mb]; }

/* When the input of chunk c for mb is available on rank r (the output of
 * chunk c-1: local FWD or received), or -1 if not yet. */
static double act_ready(const Sim *s, int r, int c, int mb) {
  if (c == 0) return 0;
  const Slot *prev = slot_at(s, c - 1, mb);
  if (prev->fwd.rank == r) return prev->fwd.t;
  if (prev->act_recv.rank == r) return prev->act_recv.t;
  return -1;
}

/* When the gradient of chunk c's output for mb is available on rank r, or
 * -1. The last chunk's backward starts from its own loss. */
static double grad_ready(const Sim *s, int r, int c, int mb) {
  if (c == s->p->chunks - 1) return 0;
  const Slot *next = slot_at(s, c + 1, mb);
  if (next->bwd.rank == r) return next->bwd.t;
  if (next->grad_recv.rank == r) return next->grad_recv.t;
  return -1;
}

/* Executes the next instruction of rank r if its inputs are there. Returns
 * 1 if it ran, 0 if the rank must wait. */
static int step_rank(Sim *s, int r, const SchedInstr *in) {
  double t = s->clock[r], start = t, end = t;
  SchedSim *o = s->out;
  Slot *sl = in->chunk >= 0 ? slot_at(s, in->chunk, in->mb) : NULL;
  switch (in->op) {
  case SCHED_OP_FWD: {
    double dep = act_ready(s, r, in->chunk, in->mb);
    if (dep < 0) return 0;
    start = dmax(t, dep);
    end = start + fwd_time(s, in->chunk);
    sl->fwd = (Done){r, end};
    o->compute[r] += end - start;
    o->busy[r] += end - start;
    /* activations are held from the start of the forward to the end of the
     * backward */
    if (++s->inflight[r] > o->peak_inflight[r]) o->peak_inflight[r] = s->inflight[r];
    s->clock[r] = end;
    break;
  }
  case SCHED_OP_BWD: {
    if (sl->fwd.rank != r) return 0;
    double dep = grad_ready(s, r, in->chunk, in->mb);
    if (dep < 0) return 0;
    start = dmax(dmax(t, dep), sl->fwd.t);
    end = start + bwd_time(s, in->chunk);
    sl->bwd = (Done){r, end};
    o->compute[r] += end - start;
    o->busy[r] += end - start;
    s->inflight[r]--;
    s->clock[r] = end;
    break;
  }
  case SCHED_OP_SEND_ACT:
    if (sl->fwd.rank != r) return 0;
    start = dmax(t, sl->fwd.t);
    end = start + s->k->t_p2p;
    sl->act_sent = (Done){in->peer, end};
    sl->act_from = r;
    s->clock[r] = start; /* asynchronous: the rank goes on */
    break;
  case SCHED_OP_SEND_GRAD:
    if (sl->bwd.rank != r) return 0;
    start = dmax(t, sl->bwd.t);
    end = start + s->k->t_p2p;
    sl->grad_sent = (Done){in->peer, end};
    sl->grad_from = r;
    s->clock[r] = start;
    break;
  case SCHED_OP_RECV_ACT:
    if (sl->act_sent.rank != r || sl->act_from != in->peer) return 0;
    end = dmax(t, sl->act_sent.t);
    sl->act_recv = (Done){r, end};
    s->clock[r] = end;
    break;
  case SCHED_OP_RECV_GRAD:
    if (sl->grad_sent.rank != r || sl->grad_from != in->peer) return 0;
    end = dmax(t, sl->grad_sent.t);
    sl->grad_recv = (Done){r, end};
    s->clock[r] = end;
    break;
  case SCHED_OP_REDUCE_GRADS:
  case SCHED_OP_OPTIMIZER_STEP:
    end = t + (in->op == SCHED_OP_REDUCE_GRADS ? s->k->t_reduce : s->k->t_optimizer);
    o->busy[r] += end - t;
    s->clock[r] = end;
    break;
  }
  o->events[o->n_events++] = (SchedEvent){r, in->op, in->chunk, in->mb, in->peer, start, end};
  return 1;
}

void sched_sim_free(SchedSim *s) {
  if (!s) return;
  free(s->busy);
  free(s->idle);
  free(s->compute);
  free(s->peak_inflight);
  free(s->stuck_at);
  free(s->events);
  s->busy = s->idle = s->compute = NULL;
  s->peak_inflight = s->stuck_at = NULL;
  s->events = NULL;
  s->n_events = 0;
}

/* Every index the simulator will use must be in range before it runs. */
static int sim_args_ok(const SchedProgram *p, const SchedCosts *k, char *err, size_t n) {
  if (!p || !k || !p->len || !p->ins || p->pp < 1 || p->m < 1 || p->chunks < 1) {
    set_err(err, n, "malformed schedule program");
    return 0;
  }
  for (int r = 0; r < p->pp; r++) {
    for (int i = 0; i < p->len[r]; i++) {
      const SchedInstr *in = &p->ins[r][i];
      if ((unsigned)in->op > (unsigned)SCHED_OP_OPTIMIZER_STEP) {
        set_err(err, n, "rank %d: #%d: unknown instruction %d", r, i, (int)in->op);
        return 0;
      }
      if (in->op == SCHED_OP_REDUCE_GRADS || in->op == SCHED_OP_OPTIMIZER_STEP) continue;
      int msg = in->op >= SCHED_OP_SEND_ACT;
      if (in->chunk < 0 || in->chunk >= p->chunks || in->mb < 0 || in->mb >= p->m ||
          (msg && (in->peer < 0 || in->peer >= p->pp))) {
        char tok[64];
        sched_format_instr(tok, sizeof tok, in);
        set_err(err, n, "rank %d: #%d %s: chunk, micro-batch or peer out of range", r, i, tok);
        return 0;
      }
    }
  }
  return 1;
}

int sched_simulate_costs(const SchedProgram *p, const SchedCosts *costs, SchedSim *out) {
  memset(out, 0, sizeof *out);
  if (!sim_args_ok(p, costs, out->message, sizeof out->message)) return -1;
  int pp = p->pp;
  size_t total = 0;
  for (int r = 0; r < pp; r++) total += (size_t)p->len[r];
  Sim s = {p, costs, NULL, NULL, NULL, out};
  s.slot = malloc((size_t)p->chunks * (size_t)p->m * sizeof *s.slot);
  s.clock = calloc((size_t)pp, sizeof *s.clock);
  s.inflight = calloc((size_t)pp, sizeof *s.inflight);
  int *pc = calloc((size_t)pp, sizeof *pc);
  out->pp = pp;
  out->busy = calloc((size_t)pp, sizeof *out->busy);
  out->idle = calloc((size_t)pp, sizeof *out->idle);
  out->compute = calloc((size_t)pp, sizeof *out->compute);
  out->peak_inflight = calloc((size_t)pp, sizeof *out->peak_inflight);
  out->stuck_at = calloc((size_t)pp, sizeof *out->stuck_at);
  out->events = malloc((total ? total : 1) * sizeof *out->events);
  if (!s.slot || !s.clock || !s.inflight || !pc || !out->busy || !out->idle || !out->compute ||
      !out->peak_inflight || !out->stuck_at || !out->events) {
    free(s.slot);
    free(s.clock);
    free(s.inflight);
    free(pc);
    sched_sim_free(out);
    memset(out, 0, sizeof *out);
    snprintf(out->message, sizeof out->message, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < (size_t)p->chunks * (size_t)p->m; i++) {
    Done none = {-1, 0};
    s.slot[i] = (Slot){none, none, none, none, none, none, -1, -1};
  }

  /* Run every rank as far as its inputs allow, round after round. Each
   * instruction's times depend only on instructions already run (its
   * rank's predecessors and the producers of its inputs), so the order in
   * which ranks are visited does not change any time. A round in which
   * nobody moves while someone is unfinished is a deadlock. */
  int progress = 1, unfinished = 1;
  while (progress && unfinished) {
    progress = 0;
    unfinished = 0;
    for (int r = 0; r < pp; r++) {
      while (pc[r] < p->len[r] && step_rank(&s, r, &p->ins[r][pc[r]])) {
        pc[r]++;
        progress = 1;
      }
      if (pc[r] < p->len[r]) unfinished = 1;
    }
  }

  /* Events were appended in execution order; put them rank by rank in list
   * order (stable: insertion sort by rank keeps list order within a rank). */
  {
    int *off = calloc((size_t)pp + 1, sizeof *off);
    SchedEvent *sorted = malloc((total ? total : 1) * sizeof *sorted);
    if (off && sorted) {
      for (int i = 0; i < out->n_events; i++) off[out->events[i].rank + 1]++;
      for (int r = 0; r < pp; r++) off[r + 1] += off[r];
      for (int i = 0; i < out->n_events; i++) sorted[off[out->events[i].rank]++] = out->events[i];
      free(out->events);
      out->events = sorted;
      sorted = NULL;
    }
    free(sorted);
    free(off);
  }

  for (int r = 0; r < pp; r++)
    if (s.clock[r] > out->makespan) out->makespan = s.clock[r];
  for (int r = 0; r < pp; r++) {
    out->idle[r] = out->makespan - out->busy[r];
    out->busy_total += out->busy[r];
    out->idle_total += out->idle[r];
    out->stuck_at[r] = pc[r] < p->len[r] ? pc[r] : -1;
  }
  out->bubble_fraction = out->makespan > 0 ? out->idle_total / (pp * out->makespan) : 0;
  out->bubble_ratio = out->busy_total > 0 ? out->idle_total / out->busy_total : 0;

  int rc = 0;
  if (unfinished) {
    out->deadlock = 1;
    rc = 1;
    size_t used = (size_t)snprintf(out->message, sizeof out->message, "deadlock:");
    for (int r = 0; r < pp && used < sizeof out->message; r++) {
      if (pc[r] >= p->len[r]) continue;
      char tok[64];
      sched_format_instr(tok, sizeof tok, &p->ins[r][pc[r]]);
      used += (size_t)snprintf(out->message + used, sizeof out->message - used, " rank %d waits at #%d %s;", r,
                               pc[r], tok);
    }
  }
  free(s.slot);
  free(s.clock);
  free(s.inflight);
  free(pc);
  return rc;
}

int sched_simulate(const SchedProgram *p, double t_fwd, double t_bwd, double t_p2p, SchedSim *out) {
  SchedCosts k = {t_fwd, t_bwd, NULL, NULL, t_p2p, 0, 0};
  return sched_simulate_costs(p, &k, out);
}

void sched_print_sim(FILE *f, const SchedSim *s) {
  if (s->deadlock) fprintf(f, "%s\n", s->message);
  fprintf(f, "makespan %.6g, bubble %.6g of the step, %.6g over ideal compute\n", s->makespan, s->bubble_fraction,
          s->bubble_ratio);
  if (!s->busy) return;
  for (int r = 0; r < s->pp; r++)
    fprintf(f, "rank %d: busy %.6g idle %.6g peak in flight %d\n", r, s->busy[r], s->idle[r], s->peak_inflight[r]);
}

int sched_build_sequential(SchedProgram *p, int pp, int m, int v) {
  if (sched_init(p, SCHED_GPIPE, pp, m, v)) return -1;
  int K = pp * v, rc = 0;
  for (int mb = 0; mb < m; mb++) {
    for (int c = 0; c < K; c++) rc |= sched_push(p, sched_chunk_rank(pp, c), SCHED_OP_FWD, c, mb, -1);
    for (int c = K - 1; c >= 0; c--) rc |= sched_push(p, sched_chunk_rank(pp, c), SCHED_OP_BWD, c, mb, -1);
  }
  if (rc) sched_free(p);
  return rc ? -1 : 0;
}
