/* test_schedule.c - pipeline schedules (core/schedule.h): completeness,
 * message pairing, Megatron's orders, the simulator against the bubble
 * closed forms of Narayanan et al. 2021 Sec. 2.2 (and cost.h's formulas),
 * micro-batches in flight, deadlock detection.
 *
 * With arguments it prints one schedule instead, for the golden tests of
 * tests/schedule.cmake:
 *   test_schedule --print gpipe|1f1b|interleaved PP M V [--compute]
 */
#include "schedule.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "test_util.h"

static const int PPS[] = {1, 2, 4, 8};
static const int MS[] = {1, 2, 4, 8, 16, 64};
static const int VS[] = {2, 3, 4};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Calls fn for every combination the brief asks for: GPipe and 1F1B for
 * every pp, m; interleaved for v in {2,3,4} where m % pp == 0. */
typedef void (*CaseFn)(Schedule kind, int pp, int m, int v);
static void for_all_cases(CaseFn fn) {
  for (int a = 0; a < COUNT(PPS); a++) {
    for (int b = 0; b < COUNT(MS); b++) {
      int pp = PPS[a], m = MS[b];
      fn(SCHED_GPIPE, pp, m, 1);
      fn(SCHED_1F1B, pp, m, 1);
      if (m % pp != 0) continue;
      for (int c = 0; c < COUNT(VS); c++) fn(SCHED_INTERLEAVED, pp, m, VS[c]);
    }
  }
}

static int build_ok(SchedProgram *p, Schedule kind, int pp, int m, int v) {
  char err[256] = "";
  int rc = sched_build(p, kind, pp, m, v, err, sizeof err);
  if (rc != 0) fprintf(stderr, "sched_build(%s, pp=%d, m=%d, v=%d): %s\n", sem_schedule_name(kind), pp, m, v, err);
  return rc == 0;
}

/* The warm-up as Megatron-LM writes it, restated here so that the library's
 * sched_warmup is checked, not trusted. */
static int megatron_warmup(Schedule kind, int pp, int m, int v, int r) {
  int total = m * v, w;
  if (kind == SCHED_GPIPE) return total;
  if (kind == SCHED_1F1B) w = pp - r - 1;
  else if (m == pp) return total;
  else w = (pp - r - 1) * 2 + (v - 1) * pp;
  return w < total ? w : total;
}

/* ---- structure ---- */

static void check_complete(Schedule kind, int pp, int m, int v) {
  SchedProgram p;
  if (!build_ok(&p, kind, pp, m, v)) {
    test_failures++;
    return;
  }
  char err[256] = "";
  int rc = sched_check(&p, err, sizeof err);
  if (rc != 0) fprintf(stderr, "%s pp=%d m=%d v=%d: %s\n", sem_schedule_name(kind), pp, m, v, err);
  EXPECT(rc == 0);

  /* Independently of sched_check: count every (chunk, mb) and pair every
   * message by hand. */
  int C = pp * v;
  size_t n = (size_t)C * (size_t)m;
  int *f = calloc(n, sizeof *f), *b = calloc(n, sizeof *b);
  int *sa = calloc(n, sizeof *sa), *ra = calloc(n, sizeof *ra);
  int *sg = calloc(n, sizeof *sg), *rg = calloc(n, sizeof *rg);
  int msgs = 0;
  for (int r = 0; r < pp; r++) {
    for (int i = 0; i < p.len[r]; i++) {
      const SchedInstr *in = &p.ins[r][i];
      size_t at = (size_t)in->chunk * (size_t)m + (size_t)in->mb;
      switch (in->op) {
      case SCHED_OP_FWD:
        EXPECT(in->chunk % pp == r);
        f[at]++;
        break;
      case SCHED_OP_BWD:
        EXPECT(in->chunk % pp == r);
        b[at]++;
        break;
      case SCHED_OP_SEND_ACT:
        EXPECT(in->chunk % pp == r && in->peer == (in->chunk + 1) % pp);
        sa[at]++;
        msgs++;
        break;
      case SCHED_OP_RECV_ACT:
        EXPECT((in->chunk + 1) % pp == r && in->peer == in->chunk % pp);
        ra[at]++;
        break;
      case SCHED_OP_SEND_GRAD:
        EXPECT(in->chunk % pp == r && in->peer == (in->chunk - 1) % pp);
        sg[at]++;
        msgs++;
        break;
      case SCHED_OP_RECV_GRAD:
        EXPECT((in->chunk - 1) % pp == r && in->peer == in->chunk % pp);
        rg[at]++;
        break;
      case SCHED_OP_REDUCE_GRADS: EXPECT(i == p.len[r] - 2); break;
      case SCHED_OP_OPTIMIZER_STEP: EXPECT(i == p.len[r] - 1); break;
      }
    }
    EXPECT(p.len[r] >= 2 && p.ins[r][p.len[r] - 1].op == SCHED_OP_OPTIMIZER_STEP);
  }
  for (int c = 0; c < C; c++) {
    for (int mb = 0; mb < m; mb++) {
      size_t at = (size_t)c * (size_t)m + (size_t)mb;
      int cross_next = pp > 1 && c + 1 < C, cross_prev = pp > 1 && c > 0;
      EXPECT(f[at] == 1 && b[at] == 1);
      EXPECT(sa[at] == cross_next && ra[at] == cross_next);
      EXPECT(sg[at] == cross_prev && rg[at] == cross_prev);
    }
  }
  /* 2 messages per micro-batch per chunk boundary, none without a pipeline */
  EXPECT(msgs == (pp > 1 ? 2 * m * (C - 1) : 0));
  free(f), free(b), free(sa), free(ra), free(sg), free(rg);
  sched_free(&p);
}

/* Megatron's compute order, read off the lists: per rank, the forwards run
 * chunk by chunk in groups of pp micro-batches, each chunk's micro-batches
 * in ascending order (first in, first out), and the backward of a chunk's
 * micro-batches in the same order as their forwards. */
static void check_order(Schedule kind, int pp, int m, int v) {
  SchedProgram p;
  if (!build_ok(&p, kind, pp, m, v)) {
    test_failures++;
    return;
  }
  for (int r = 0; r < pp; r++) {
    int nf = 0, nb = 0, first_b = -1;
    for (int i = 0; i < p.len[r]; i++) {
      const SchedInstr *in = &p.ins[r][i];
      if (in->op != SCHED_OP_FWD && in->op != SCHED_OP_BWD) continue;
      int fwd = in->op == SCHED_OP_FWD;
      int k = fwd ? nf++ : nb++;
      int lc = (k % (pp * v)) / pp;
      int want_chunk = (fwd ? lc : v - 1 - lc) * pp + r;
      int want_mb = (k / (pp * v)) * pp + k % pp;
      EXPECT(in->chunk == want_chunk && in->mb == want_mb);
      if (!fwd && first_b < 0) first_b = nf;
    }
    EXPECT(nf == m * v && nb == m * v);
    /* forwards before the first backward: the warm-up, plus the steady
     * state's first forward when there is a steady state */
    int w = megatron_warmup(kind, pp, m, v, r);
    EXPECT(sched_warmup(kind, pp, m, v, r) == w);
    EXPECT(first_b == (w < m * v ? w + 1 : m * v));
  }
  sched_free(&p);
}

/* ---- simulation ---- */

static double exact_sim(const SchedProgram *p, double tf, double tb, double p2p, SchedSim *s) {
  int rc = sched_simulate(p, tf, tb, p2p, s);
  if (rc != 0) fprintf(stderr, "simulate %s pp=%d m=%d v=%d: rc %d %s\n", sem_schedule_name(p->kind), p->pp, p->m,
                       p->v, rc, s->message);
  EXPECT(rc == 0 && !s->deadlock);
  return s->makespan;
}

/* Events honour the dependencies and the one-at-a-time rule. */
static void check_events(const SchedProgram *p, const SchedSim *s) {
  int total = 0;
  for (int r = 0; r < p->pp; r++) total += p->len[r];
  EXPECT(s->n_events == total);
  int C = p->chunks, m = p->m;
  double *fend = malloc((size_t)C * (size_t)m * sizeof *fend);
  double *bend = malloc((size_t)C * (size_t)m * sizeof *bend);
  for (int i = 0; i < s->n_events; i++) {
    const SchedEvent *e = &s->events[i];
    if (e->op == SCHED_OP_FWD) fend[e->chunk * m + e->mb] = e->end;
    if (e->op == SCHED_OP_BWD) bend[e->chunk * m + e->mb] = e->end;
  }
  int ev = 0;
  for (int r = 0; r < p->pp; r++) {
    double prev_end = 0;
    for (int i = 0; i < p->len[r]; i++, ev++) {
      const SchedEvent *e = &s->events[ev];
      EXPECT(e->rank == r && e->op == p->ins[r][i].op && e->chunk == p->ins[r][i].chunk && e->mb == p->ins[r][i].mb);
      EXPECT(e->end >= e->start);
      if (e->op == SCHED_OP_SEND_ACT || e->op == SCHED_OP_SEND_GRAD) {
        EXPECT(e->start >= prev_end); /* issued in order; the rank does not wait */
        continue;
      }
      if (e->op != SCHED_OP_RECV_ACT && e->op != SCHED_OP_RECV_GRAD) EXPECT(e->start >= prev_end);
      prev_end = e->end;
      if (e->op == SCHED_OP_FWD && e->chunk > 0) EXPECT(e->start >= fend[(e->chunk - 1) * m + e->mb]);
      if (e->op == SCHED_OP_BWD) {
        EXPECT(e->start >= fend[e->chunk * m + e->mb]);
        if (e->chunk + 1 < C) EXPECT(e->start >= bend[(e->chunk + 1) * m + e->mb]);
      }
    }
  }
  free(fend);
  free(bend);
}

/* Unit compute times, free transfers: the closed forms hold exactly.
 * GPipe and 1F1B (Narayanan et al. 2021 Sec. 2.2.1): every rank idles
 * (pp-1)(t_f + t_b); bubble (pp-1)/m of the ideal, (pp-1)/(m+pp-1) of the
 * step. Interleaved (Sec. 2.2.2): with per-chunk times 1/v of a stage's,
 * the idle time is (pp-1)(t_f + t_b)/v of a stage, i.e. (pp-1) chunk
 * forwards and backwards, and the bubble (pp-1)/(v m) of the ideal. Times
 * are in chunk units (t_f = t_b = 1 per chunk) so every number is an exact
 * integer. */
static void check_bubble(Schedule kind, int pp, int m, int v) {
  SchedProgram p;
  if (!build_ok(&p, kind, pp, m, v)) {
    test_failures++;
    return;
  }
  /* t_b = t_f and t_b = 2 t_f (the usual ratio of a backward pass) */
  const double tbs[] = {1, 2};
  for (int i = 0; i < COUNT(tbs); i++) {
    double tf = 1, tb = tbs[i];
    SchedSim s;
    double makespan = exact_sim(&p, tf, tb, 0, &s);
    if (s.deadlock) {
      sched_sim_free(&s);
      continue;
    }
    double ideal = (double)m * v * (tf + tb);
    EXPECT(makespan == ideal + (pp - 1) * (tf + tb));
    for (int r = 0; r < pp; r++) {
      EXPECT(s.busy[r] == ideal && s.compute[r] == ideal);
      EXPECT(s.idle[r] == (pp - 1) * (tf + tb));
    }
    double want_ratio = (double)(pp - 1) / ((double)m * v);
    double want_fraction = (double)(pp - 1) / ((double)m * v + pp - 1);
    EXPECT_NEAR(s.bubble_ratio, want_ratio, 1e-12);
    EXPECT_NEAR(s.bubble_fraction, want_fraction, 1e-12);
    /* the planner's formulas (cost.h) agree with the simulation */
    EXPECT_NEAR(s.bubble_ratio, cost_bubble_fraction(kind, pp, m, v), 1e-12);
    EXPECT_NEAR(s.bubble_fraction, cost_bubble_step_fraction(kind, pp, m, v), 1e-12);
    /* micro-batches in flight: GPipe m, 1F1B min(pp - r, m), interleaved
     * min(warm-up + 1, m v) in chunk units; the simulator's count (over
     * time) equals the count over the list */
    for (int r = 0; r < pp; r++) {
      int want;
      if (kind == SCHED_GPIPE) want = m;
      else if (kind == SCHED_1F1B) want = pp - r < m ? pp - r : m;
      else {
        int w = megatron_warmup(kind, pp, m, v, r);
        want = w + 1 < m * v ? w + 1 : m * v;
      }
      if (s.peak_inflight[r] != want || sched_peak_inflight(&p, r) != want)
        fprintf(stderr, "%s pp=%d m=%d v=%d rank %d: peak %d / %d, want %d\n", sem_schedule_name(kind), pp, m, v, r,
                s.peak_inflight[r], sched_peak_inflight(&p, r), want);
      EXPECT(s.peak_inflight[r] == want && sched_peak_inflight(&p, r) == want);
    }
    check_events(&p, &s);
    sched_sim_free(&s);
  }
  sched_free(&p);
}

static void test_bubble_in_stage_units(void) {
  /* The same statement as the brief puts it: a stage's forward / backward
   * take t_f, t_b; with v chunks each chunk takes t_f / v, t_b / v. The
   * bubble over ideal is (pp-1)/(v m) (Sec. 2.2.2); powers of two keep the
   * arithmetic exact. */
  SchedProgram p;
  if (!build_ok(&p, SCHED_INTERLEAVED, 4, 8, 2)) {
    test_failures++;
    return;
  }
  SchedSim s;
  double tf = 1.0, tb = 2.0;
  exact_sim(&p, tf / 2, tb / 2, 0, &s);
  EXPECT(s.makespan == 8 * (tf + tb) + 3 * (tf + tb) / 2);
  EXPECT(s.bubble_ratio == 3.0 / 16);
  EXPECT_NEAR(s.bubble_ratio, cost_bubble_fraction(SCHED_INTERLEAVED, 4, 8, 2), 1e-15);
  sched_sim_free(&s);
  sched_free(&p);

  /* ... against 1F1B on the same model: the bubble halves */
  if (!build_ok(&p, SCHED_1F1B, 4, 8, 1)) {
    test_failures++;
    return;
  }
  exact_sim(&p, tf, tb, 0, &s);
  EXPECT(s.makespan == 8 * (tf + tb) + 3 * (tf + tb));
  EXPECT(s.bubble_ratio == 3.0 / 8);
  sched_sim_free(&s);
  sched_free(&p);
}

static void test_p2p_latency(void) {
  /* GPipe with a transfer latency d: the first micro-batch reaches the last
   * stage (pp-1)(t_f + d) late and its gradient returns (pp-1)(t_b + d)
   * late, so makespan = (m + pp - 1)(t_f + t_b) + 2 (pp-1) d. */
  SchedProgram p;
  if (!build_ok(&p, SCHED_GPIPE, 4, 8, 1)) {
    test_failures++;
    return;
  }
  SchedSim s;
  exact_sim(&p, 1, 2, 0.5, &s);
  EXPECT(s.makespan == (8 + 3) * 3 + 2 * 3 * 0.5);
  for (int r = 0; r < 4; r++) EXPECT(s.busy[r] == 8 * 3);
  /* sends take no rank time; a receive's event is the wait for the data */
  for (int i = 0; i < s.n_events; i++) {
    const SchedEvent *e = &s.events[i];
    if (e->op == SCHED_OP_SEND_ACT || e->op == SCHED_OP_SEND_GRAD) EXPECT(e->end - e->start == 0.5);
  }
  sched_sim_free(&s);
  sched_free(&p);

  /* every schedule is slower, never faster, with latency, and still
   * finishes */
  const Schedule kinds[] = {SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED};
  for (int k = 0; k < 3; k++) {
    int v = kinds[k] == SCHED_INTERLEAVED ? 2 : 1;
    if (!build_ok(&p, kinds[k], 4, 8, v)) {
      test_failures++;
      continue;
    }
    SchedSim a, b;
    exact_sim(&p, 1, 2, 0, &a);
    exact_sim(&p, 1, 2, 0.25, &b);
    EXPECT(b.makespan > a.makespan);
    EXPECT(b.makespan >= a.makespan + 2 * 3 * 0.25); /* at least one round trip of the pipeline */
    sched_sim_free(&a);
    sched_sim_free(&b);
    sched_free(&p);
  }
}

static void test_costs(void) {
  /* per-chunk times: a slow last stage (the logits) sets the pace, and the
   * reduce / optimizer times add to every rank's busy time */
  SchedProgram p;
  if (!build_ok(&p, SCHED_1F1B, 2, 4, 1)) {
    test_failures++;
    return;
  }
  const double fwd[] = {1, 2}, bwd[] = {2, 4};
  SchedCosts k = {0, 0, fwd, bwd, 0, 0.5, 0.25};
  SchedSim s;
  EXPECT(sched_simulate_costs(&p, &k, &s) == 0);
  EXPECT(s.busy[0] == 4 * 3 + 0.75 && s.busy[1] == 4 * 6 + 0.75);
  EXPECT(s.compute[0] == 12 && s.compute[1] == 24);
  /* rank 1 gets its first input at t=1 and never waits again, so its last
   * backward ends at 1 + 24 = 25; rank 0's last backward needs that
   * gradient and takes 2, then reduce and step: 27.75 */
  EXPECT(s.makespan == 27.75);
  EXPECT(s.idle[1] == 27.75 - 24.75);
  sched_sim_free(&s);
  sched_free(&p);
}

/* ---- fixed small cases, by hand from Megatron's code ---- */

static char *print_to_string(const SchedProgram *p, unsigned flags) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  if (!f) return NULL;
  sched_print(f, p, flags);
  fclose(f);
  return buf;
}

static void expect_print(Schedule kind, int pp, int m, int v, unsigned flags, const char *want) {
  SchedProgram p;
  if (!build_ok(&p, kind, pp, m, v)) {
    test_failures++;
    return;
  }
  char *got = print_to_string(&p, flags);
  EXPECT_STR(got, want);
  free(got);
  sched_free(&p);
}

static void test_small_cases(void) {
  /* 1F1B, pp=2, m=2: rank 0 warms up with one forward */
  expect_print(SCHED_1F1B, 2, 2, 1, 0,
               "schedule 1f1b pp=2 m=2 v=1\n"
               "rank 0: F0.0 sa0.0>1 F0.1 sa0.1>1 rg1.0<1 B0.0 rg1.1<1 B0.1 reduce step\n"
               "rank 1: ra0.0<0 F1.0 B1.0 sg1.0>0 ra0.1<0 F1.1 B1.1 sg1.1>0 reduce step\n");
  /* 1F1B, pp=4, m=6: warm-ups 3, 2, 1, 0 (Narayanan et al. 2021 Fig. 4 top) */
  expect_print(SCHED_1F1B, 4, 6, 1, SCHED_PRINT_COMPUTE,
               "schedule 1f1b pp=4 m=6 v=1\n"
               "rank 0: F0.0 F0.1 F0.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 B0.3 B0.4 B0.5\n"
               "rank 1: F1.0 F1.1 F1.2 B1.0 F1.3 B1.1 F1.4 B1.2 F1.5 B1.3 B1.4 B1.5\n"
               "rank 2: F2.0 F2.1 B2.0 F2.2 B2.1 F2.3 B2.2 F2.4 B2.3 F2.5 B2.4 B2.5\n"
               "rank 3: F3.0 B3.0 F3.1 B3.1 F3.2 B3.2 F3.3 B3.3 F3.4 B3.4 F3.5 B3.5\n");
  /* Interleaved, pp=2, m=4, v=2 (rank 0 holds chunks 0 and 2, rank 1
   * chunks 1 and 3). Warm-up: rank 0 (2-0-1)*2 + (2-1)*2 = 4, rank 1 2.
   * Forwards in groups of pp=2 micro-batches per chunk; backwards the
   * same with the chunks reversed. */
  expect_print(SCHED_INTERLEAVED, 2, 4, 2, SCHED_PRINT_COMPUTE,
               "schedule interleaved pp=2 m=4 v=2\n"
               "rank 0: F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3\n"
               "rank 1: F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3\n");
  /* m == pp: Megatron runs every forward first */
  expect_print(SCHED_INTERLEAVED, 2, 2, 2, SCHED_PRINT_COMPUTE,
               "schedule interleaved pp=2 m=2 v=2\n"
               "rank 0: F0.0 F0.1 F2.0 F2.1 B2.0 B2.1 B0.0 B0.1\n"
               "rank 1: F1.0 F1.1 F3.0 F3.1 B3.0 B3.1 B1.0 B1.1\n");
  /* GPipe: all forwards, then all backwards in the same order */
  expect_print(SCHED_GPIPE, 2, 3, 1, SCHED_PRINT_COMPUTE,
               "schedule gpipe pp=2 m=3 v=1\n"
               "rank 0: F0.0 F0.1 F0.2 B0.0 B0.1 B0.2\n"
               "rank 1: F1.0 F1.1 F1.2 B1.0 B1.1 B1.2\n");
  /* No pipeline: no messages; interleaving on one rank runs the chunks in
   * turn */
  expect_print(SCHED_1F1B, 1, 2, 1, 0, "schedule 1f1b pp=1 m=2 v=1\nrank 0: F0.0 B0.0 F0.1 B0.1 reduce step\n");
  expect_print(SCHED_INTERLEAVED, 1, 2, 2, 0,
               "schedule interleaved pp=1 m=2 v=2\nrank 0: F0.0 F1.0 B1.0 F0.1 B0.0 F1.1 B1.1 B0.1 reduce step\n");

  /* the 1F1B pp=2 m=2 timeline with t_f = 1, t_b = 2 */
  SchedProgram p;
  if (build_ok(&p, SCHED_1F1B, 2, 2, 1)) {
    SchedSim s;
    exact_sim(&p, 1, 2, 0, &s);
    /* rank 1: F1.0 [1,2] B1.0 [2,4] F1.1 [4,5] B1.1 [5,7];
     * rank 0: F0.0 [0,1] F0.1 [1,2] B0.0 [4,6] B0.1 [7,9] */
    EXPECT(s.makespan == 9);
    EXPECT(s.idle[0] == 3 && s.idle[1] == 3);
    int found = 0;
    for (int i = 0; i < s.n_events; i++) {
      const SchedEvent *e = &s.events[i];
      if (e->rank == 0 && e->op == SCHED_OP_BWD && e->mb == 1) {
        EXPECT(e->start == 7 && e->end == 9);
        found++;
      }
      if (e->rank == 0 && e->op == SCHED_OP_RECV_GRAD && e->mb == 0) {
        EXPECT(e->start == 2 && e->end == 4); /* the wait, from reaching it to the data */
        found++;
      }
    }
    EXPECT(found == 2);
    sched_sim_free(&s);
    sched_free(&p);
  } else {
    test_failures++;
  }
}

/* ---- errors ---- */

static void test_bad_args(void) {
  SchedProgram p;
  char err[256];
  EXPECT(sched_build(&p, SCHED_INTERLEAVED, 4, 6, 2, err, sizeof err) == -1);
  EXPECT(strstr(err, "divisible") != NULL);
  EXPECT(sched_build(&p, SCHED_INTERLEAVED, 2, 4, 1, err, sizeof err) == -1);
  EXPECT(sched_build(&p, SCHED_1F1B, 2, 4, 2, err, sizeof err) == -1);
  EXPECT(sched_build(&p, SCHED_GPIPE, 0, 4, 1, err, sizeof err) == -1);
  EXPECT(sched_build(&p, SCHED_GPIPE, 2, 0, 1, err, sizeof err) == -1);
  EXPECT(sched_build(&p, (Schedule)7, 2, 2, 1, err, sizeof err) == -1);
  EXPECT(sched_warmup(SCHED_1F1B, 2, 4, 1, 2) == -1);
  EXPECT(p.ins == NULL);
  sched_free(&p); /* harmless on an empty program */
}

static void expect_check_fails(const SchedProgram *p, const char *needle) {
  char err[256] = "";
  EXPECT(sched_check(p, err, sizeof err) == -1);
  if (!strstr(err, needle)) fprintf(stderr, "sched_check said \"%s\", expected it to mention \"%s\"\n", err, needle);
  EXPECT(strstr(err, needle) != NULL);
}

static void test_check_catches(void) {
  SchedProgram p;
  if (!build_ok(&p, SCHED_1F1B, 2, 2, 1)) {
    test_failures++;
    return;
  }
  /* a forward on the wrong rank */
  SchedInstr saved = p.ins[1][1];
  EXPECT(saved.op == SCHED_OP_FWD);
  p.ins[1][1].chunk = 0;
  expect_check_fails(&p, "belongs on rank 0");
  p.ins[1][1] = saved;
  /* a duplicated backward instead of another */
  saved = p.ins[1][6];
  EXPECT(saved.op == SCHED_OP_BWD && saved.mb == 1);
  p.ins[1][6].mb = 0;
  expect_check_fails(&p, "appears 2 times");
  p.ins[1][6] = saved;
  /* a receive naming the wrong sender */
  saved = p.ins[1][0];
  EXPECT(saved.op == SCHED_OP_RECV_ACT);
  p.ins[1][0].peer = 1;
  expect_check_fails(&p, "peer must be rank 0");
  p.ins[1][0] = saved;
  /* no optimizer step at the end */
  p.len[0]--;
  expect_check_fails(&p, "must end with reduce step");
  p.len[0]++;
  char err[256];
  EXPECT(sched_check(&p, err, sizeof err) == 0);
  sched_free(&p);

  /* a hand-written program missing a send */
  SchedProgram q;
  EXPECT(sched_init(&q, SCHED_GPIPE, 2, 1, 1) == 0);
  sched_push(&q, 0, SCHED_OP_FWD, 0, 0, -1);
  sched_push(&q, 0, SCHED_OP_RECV_GRAD, 1, 0, 1);
  sched_push(&q, 0, SCHED_OP_BWD, 0, 0, -1);
  sched_push(&q, 0, SCHED_OP_REDUCE_GRADS, -1, -1, -1);
  sched_push(&q, 0, SCHED_OP_OPTIMIZER_STEP, -1, -1, -1);
  sched_push(&q, 1, SCHED_OP_RECV_ACT, 0, 0, 0);
  sched_push(&q, 1, SCHED_OP_FWD, 1, 0, -1);
  sched_push(&q, 1, SCHED_OP_BWD, 1, 0, -1);
  sched_push(&q, 1, SCHED_OP_SEND_GRAD, 1, 0, 0);
  sched_push(&q, 1, SCHED_OP_REDUCE_GRADS, -1, -1, -1);
  sched_push(&q, 1, SCHED_OP_OPTIMIZER_STEP, -1, -1, -1);
  expect_check_fails(&q, "SEND_ACT of chunk 0 micro-batch 0 appears 0 times");
  /* ... which the simulator reports as a deadlock instead of waiting forever */
  SchedSim s;
  EXPECT(sched_simulate(&q, 1, 1, 0, &s) == 1);
  EXPECT(s.deadlock == 1);
  EXPECT(strstr(s.message, "rank 0 waits at #1 rg1.0<1") != NULL);
  EXPECT(strstr(s.message, "rank 1 waits at #0 ra0.0<0") != NULL);
  EXPECT(s.stuck_at[0] == 1 && s.stuck_at[1] == 0);
  EXPECT(s.n_events == 1); /* only F0.0 ran */
  sched_sim_free(&s);
  sched_free(&q);
}

static void test_deadlock(void) {
  /* A structurally complete program in a fatal order: rank 0 waits for the
   * gradient of micro-batch 0 before sending its activation, rank 1 waits
   * for that activation before it can produce the gradient. */
  SchedProgram p;
  if (!build_ok(&p, SCHED_1F1B, 2, 2, 1)) {
    test_failures++;
    return;
  }
  /* rank 0: F0.0 sa0.0>1 F0.1 sa0.1>1 rg1.0<1 ... -> F0.0 rg1.0<1 F0.1 sa0.1>1 sa0.0>1 ... */
  SchedInstr sa0 = p.ins[0][1], rg0 = p.ins[0][4];
  EXPECT(sa0.op == SCHED_OP_SEND_ACT && rg0.op == SCHED_OP_RECV_GRAD);
  p.ins[0][1] = rg0;
  p.ins[0][4] = sa0;
  char err[256];
  EXPECT(sched_check(&p, err, sizeof err) == 0); /* order is not its business */
  SchedSim s;
  EXPECT(sched_simulate(&p, 1, 2, 0.1, &s) == 1);
  EXPECT(s.deadlock == 1 && strstr(s.message, "deadlock") != NULL);
  EXPECT(s.stuck_at[0] == 1 && s.stuck_at[1] == 0);
  sched_sim_free(&s);

  /* a receive whose sender sends to someone else never completes either */
  p.ins[0][1] = sa0;
  p.ins[0][4] = rg0;
  EXPECT(sched_simulate(&p, 1, 2, 0, &s) == 0);
  sched_sim_free(&s);
  p.ins[0][1].peer = 0; /* a send to itself */
  EXPECT(sched_simulate(&p, 1, 2, 0, &s) == 1);
  sched_sim_free(&s);
  p.ins[0][1] = sa0;

  /* a backward before its own forward on one rank */
  SchedProgram q;
  EXPECT(sched_init(&q, SCHED_GPIPE, 1, 1, 1) == 0);
  sched_push(&q, 0, SCHED_OP_BWD, 0, 0, -1);
  sched_push(&q, 0, SCHED_OP_FWD, 0, 0, -1);
  EXPECT(sched_simulate(&q, 1, 1, 0, &s) == 1);
  EXPECT(strstr(s.message, "rank 0 waits at #0 B0.0") != NULL);
  sched_sim_free(&s);
  /* out-of-range fields are refused, not simulated */
  sched_push(&q, 0, SCHED_OP_FWD, 5, 0, -1);
  EXPECT(sched_simulate(&q, 1, 1, 0, &s) == -1);
  EXPECT(strstr(s.message, "out of range") != NULL);
  sched_sim_free(&s);
  sched_free(&q);
  sched_free(&p);
}

static void test_large(void) {
  /* A Megatron-sized pipeline (Narayanan et al. 2021 Table 1, 1T row:
   * pp=64; with m=128 and interleaving v=2) still builds, checks and
   * simulates, and the bubble formula holds. */
  SchedProgram p;
  if (!build_ok(&p, SCHED_INTERLEAVED, 64, 128, 2)) {
    test_failures++;
    return;
  }
  char err[256];
  EXPECT(sched_check(&p, err, sizeof err) == 0);
  SchedSim s;
  exact_sim(&p, 1, 2, 0, &s);
  EXPECT_NEAR(s.bubble_ratio, 63.0 / 256, 1e-12);
  sched_sim_free(&s);
  sched_free(&p);
}

/* ---- golden printer ---- */

static int print_mode(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s --print gpipe|1f1b|interleaved PP M V [--compute]\n", argv[0]);
    return 2;
  }
  Schedule kind;
  if (strcmp(argv[2], "gpipe") == 0) kind = SCHED_GPIPE;
  else if (strcmp(argv[2], "1f1b") == 0) kind = SCHED_1F1B;
  else if (strcmp(argv[2], "interleaved") == 0) kind = SCHED_INTERLEAVED;
  else {
    fprintf(stderr, "unknown schedule %s\n", argv[2]);
    return 2;
  }
  unsigned flags = argc > 6 && strcmp(argv[6], "--compute") == 0 ? SCHED_PRINT_COMPUTE : 0;
  SchedProgram p;
  char err[256];
  if (sched_build(&p, kind, atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  sched_print(stdout, &p, flags);
  sched_free(&p);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--print") == 0) return print_mode(argc, argv);
  for_all_cases(check_complete);
  for_all_cases(check_order);
  for_all_cases(check_bubble);
  test_bubble_in_stage_units();
  test_p2p_latency();
  test_costs();
  test_small_cases();
  test_bad_args();
  test_check_catches();
  test_deadlock();
  test_large();
  TEST_DONE();
}
