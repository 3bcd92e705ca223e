/* sim.c - simulated ranks (see sim.h). */
#include "sim.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autodiff.h"
#include "dpsync.h"
#include "interp.h"
#include "lower.h"
#include "moepack.h"
#include "pipeline.h"
#include "precision.h"
#include "plan.h"
#include "schedule.h"
#include "shard.h"
#include "spmd.h"

enum { SIM_TIMEOUT_S = 120 };

/* ---- groups: a rendezvous for collectives ---- */

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int size, arrived;
  unsigned gen;
  double **deposit;
} Group;

static void group_init(Group *g, int size) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->size = size;
  g->deposit = calloc((size_t)size, sizeof(double *));
}

static void group_destroy(Group *g) {
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g->deposit);
}

static void deadline(struct timespec *ts) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += SIM_TIMEOUT_S;
}

/* A barrier that gives up (a peer died or never came) instead of hanging. */
static const char *barrier(Group *g) {
  pthread_mutex_lock(&g->mu);
  unsigned gen = g->gen;
  const char *err = NULL;
  if (++g->arrived == g->size) {
    g->arrived = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
  } else {
    struct timespec ts;
    deadline(&ts);
    while (gen == g->gen && !err)
      if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT) err = "a peer did not reach the collective";
  }
  pthread_mutex_unlock(&g->mu);
  return err;
}

/* ---- mailboxes for pipeline transfers ---- */

/* A message is named by its kind, the chunk that produced it and its
 * micro-batch, so that a schedule with several micro-batches in flight (and
 * a rank holding several chunks) takes the one it means: a receive waits
 * for its own tag, whatever else arrived first. */
enum { TAG_ACT, TAG_GRAD, TAG_RING };

typedef struct Letter {
  int kind, chunk, mb;
  double *data;
  int64_t n;
  struct Letter *next;
} Letter;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  Letter *head, *tail;
} Mailbox;

/* ---- the simulation ---- */

typedef struct Sim Sim;

typedef struct {
  Sim *S;
  int d, p, t, x; /* replica, pipeline rank, tensor rank, context rank */
  int index;
  int nlocal;     /* chunks this pipeline rank holds: p, p + pp, ... */
  Interp **in;    /* per local chunk */
  const AdResult **ad;
  const DpSync **sync;   /* per local chunk: its dp.sync (dpsync.h) */
  InterpTensor **synced; /* per local chunk: dp.sync's outputs, this rank's synchronised gradients */
  int cur_chunk, cur_mb; /* what runs now: names the messages */
  double loss_sum;
  const char *err;
  char errbuf[256];
} Rank;

struct Sim {
  const SimLayout *L;
  int64_t K; /* chunks */
  int64_t PP; /* pipeline ranks */
  SchedProgram prog;
  int nranks;
  Rank *ranks;
  Group *tp_groups, *cp_groups, *dp_groups, *ep_groups, *edp_groups;
  int ep;    /* expert parallelism (1: none) */
  int ep_dp; /* the data-parallel ranks in an expert group: ep, or ep / tp folded (SimLayout.ep_fold) */
  int fold;  /* the expert group folded over the tensor group */
  Mailbox *boxes; /* nranks x nranks */
  double *const *inputs;
  const IrModule *global;
  int64_t *input_row; /* values per micro-batch row of each input */
};

static int rank_index(const Sim *S, int d, int p, int t, int x) {
  return ((d * (int)S->PP + p) * (int)S->L->tp + t) * (int)S->L->cp + x;
}

/* The rendezvous of rank R's group gr, and R's place in it. */
static Group *group_of(Sim *S, const Rank *R, IrGroup gr, int *me) {
  if (gr == IRG_DP) {
    *me = R->d;
    return &S->dp_groups[rank_index(S, 0, R->p, R->t, R->x)];
  }
  if (gr == IRG_TP) {
    *me = R->t;
    return &S->tp_groups[rank_index(S, R->d, R->p, 0, R->x)];
  }
  if (gr == IRG_EP) { /* ep consecutive replicas; folded, the tensor group times ep / tp of them */
    int b = R->d % S->ep_dp;
    *me = S->fold ? R->t + (int)S->L->tp * b : b;
    return &S->ep_groups[rank_index(S, R->d - b, R->p, S->fold ? 0 : R->t, R->x)];
  }
  if (gr == IRG_EDP) { /* the replicas at the same place of their ep block */
    *me = R->d / S->ep_dp;
    return &S->edp_groups[rank_index(S, R->d % S->ep_dp, R->p, R->t, R->x)];
  }
  *me = R->x;
  return &S->cp_groups[rank_index(S, R->d, R->p, R->t, 0)];
}

static const char *sim_all_reduce(void *ctx, IrGroup gr, int op, double *data, int64_t n) {
  Rank *R = ctx;
  Sim *S = R->S;
  int me;
  Group *g = group_of(S, R, gr, &me);
  double *mine = malloc(sizeof(double) * (size_t)(n ? n : 1));
  memcpy(mine, data, sizeof(double) * (size_t)n);
  g->deposit[me] = mine;
  const char *err = barrier(g);
  /* every member sums in rank order, so all get the same bits */
  for (int64_t i = 0; i < n && !err; i++) {
    double v = g->deposit[0][i];
    for (int k = 1; k < g->size; k++) v = op ? (g->deposit[k][i] > v ? g->deposit[k][i] : v) : v + g->deposit[k][i];
    data[i] = v;
  }
  if (!err) err = barrier(g);
  free(mine);
  return err;
}

static const char *sim_all_gather(void *ctx, IrGroup gr, const double *in, int64_t n, double *out) {
  Rank *R = ctx;
  Sim *S = R->S;
  int me;
  Group *g = group_of(S, R, gr, &me);
  g->deposit[me] = (double *)in;
  const char *err = barrier(g);
  for (int k = 0; k < g->size && !err; k++) memcpy(out + k * n, g->deposit[k], sizeof(double) * (size_t)n);
  if (!err) err = barrier(g);
  return err;
}

static Mailbox *box(Sim *S, int from, int to) { return &S->boxes[from * S->nranks + to]; }

/* The peer `offset` places along a group: pipeline chunks in a line, the
 * context group a ring (ring attention). -1 when there is none. */
static int peer_of(Sim *S, const Rank *R, IrGroup gr, int offset) {
  if (gr == IRG_PP) {
    int c = R->cur_chunk + offset;
    return c < 0 || c >= S->K ? -1 : rank_index(S, R->d, sched_chunk_rank((int)S->PP, c), R->t, R->x);
  }
  if (gr == IRG_CP) {
    int c = (int)S->L->cp;
    return rank_index(S, R->d, R->p, R->t, ((R->x + offset) % c + c) % c);
  }
  return -1;
}

/* The tag of a transfer by the running chunk: a pipeline send carries this
 * chunk's activation (forward) or input gradient (backward); a receive
 * takes the neighbour's. */
static void tag_of(const Rank *R, IrGroup gr, int offset, int sending, int *kind, int *chunk) {
  if (gr != IRG_PP) {
    *kind = TAG_RING;
    *chunk = R->cur_chunk;
    return;
  }
  *kind = (offset > 0) == (sending != 0) ? TAG_ACT : TAG_GRAD;
  *chunk = sending ? R->cur_chunk : R->cur_chunk + offset;
}

static const char *sim_send(void *ctx, IrGroup gr, int offset, const double *data, int64_t n) {
  Rank *R = ctx;
  Sim *S = R->S;
  int to = peer_of(S, R, gr, offset);
  if (to < 0) return "send to a rank that does not exist";
  Mailbox *b = box(S, R->index, to);
  Letter *l = calloc(1, sizeof *l);
  tag_of(R, gr, offset, 1, &l->kind, &l->chunk);
  l->mb = R->cur_mb;
  l->data = malloc(sizeof(double) * (size_t)(n ? n : 1));
  memcpy(l->data, data, sizeof(double) * (size_t)n);
  l->n = n;
  pthread_mutex_lock(&b->mu);
  if (b->tail) b->tail->next = l;
  else b->head = l;
  b->tail = l;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

static const char *sim_recv(void *ctx, IrGroup gr, int offset, double *data, int64_t n) {
  Rank *R = ctx;
  Sim *S = R->S;
  int from = peer_of(S, R, gr, offset);
  if (from < 0) return "recv from a rank that does not exist";
  Mailbox *b = box(S, from, R->index);
  int kind, chunk;
  tag_of(R, gr, offset, 0, &kind, &chunk);
  const char *err = NULL;
  struct timespec ts;
  deadline(&ts);
  pthread_mutex_lock(&b->mu);
  Letter *l = NULL, *prev = NULL;
  while (!l && !err) {
    prev = NULL;
    for (l = b->head; l && !(l->kind == kind && l->chunk == chunk && l->mb == R->cur_mb); l = l->next) prev = l;
    if (!l && pthread_cond_timedwait(&b->cv, &b->mu, &ts) == ETIMEDOUT) err = "the peer never sent";
  }
  if (l) {
    if (prev) prev->next = l->next;
    else b->head = l->next;
    if (b->tail == l) b->tail = prev;
  }
  pthread_mutex_unlock(&b->mu);
  if (l) {
    if (l->n != n) err = "a message of another size arrived";
    else memcpy(data, l->data, sizeof(double) * (size_t)n);
    free(l->data);
    free(l);
  }
  return err;
}

/* Runs local chunk j's dp.sync on the accumulated gradients (dpsync.h):
 * argument k is parameter param[k]'s store from copy first[k] on, copies
 * side by side. */
static const char *rank_sync(Rank *R, int j) {
  const DpSync *s = R->sync[j];
  const IrGraph *g = s->m->graphs[s->graph];
  InterpTensor *args = calloc((size_t)s->nargs + 1, sizeof(InterpTensor));
  double **zeros = calloc((size_t)s->nargs + 1, sizeof(double *));
  R->synced[j] = calloc((size_t)s->nargs + 1, sizeof(InterpTensor));
  for (int k = 0; k < s->nargs; k++) {
    const IrNode *a = &g->nodes[k];
    args[k].rank = a->rank;
    memcpy(args[k].dims, a->dims, sizeof args[k].dims);
    args[k].data = interp_grad(R->in[j], s->param[k], s->first[k], NULL);
    if (!args[k].data) args[k].data = zeros[k] = calloc((size_t)ir_numel(a), sizeof(double));
  }
  const char *err = NULL;
  interp_run(R->in[j], s->graph, 0, args, s->nargs, R->synced[j], &err);
  for (int k = 0; k < s->nargs; k++) free(zeros[k]);
  free(zeros);
  free(args);
  return err;
}

static void rank_fail(Rank *R, const char *what, int chunk, int mb, const char *err) {
  snprintf(R->errbuf, sizeof R->errbuf, "rank (dp %d, pipeline %d, tp %d, cp %d), %s of chunk %d, micro-batch %d: %s", R->d, R->p, R->t,
           R->x, what, chunk, mb, err ? err : "failed");
  R->err = R->errbuf;
}

/* A pipeline rank runs its instruction list (schedule.h): FWD runs the
 * chunk's forward part with the micro-batch's inputs and keeps its stash;
 * BWD runs the backward part on that stash. The transfers are the graphs'
 * own SEND / RECV nodes, named by (kind, chunk, micro-batch); a send never
 * waits, so the list's SEND / RECV instructions need no action here. */
static void *rank_main(void *arg) {
  Rank *R = arg;
  Sim *S = R->S;
  const SimLayout *L = S->L;
  const IrModule *m = S->global;
  int M = (int)L->num_micro;
  InterpFrame **frames = calloc((size_t)(R->nlocal * M), sizeof(InterpFrame *));
  double seed = 1.0 / (double)L->num_micro;
  InterpTensor s;
  memset(&s, 0, sizeof s);
  s.data = &seed;
  const SchedProgram *P = &S->prog;
  for (int i = 0; i < P->len[R->p] && !R->err; i++) {
    const SchedInstr *ins = &P->ins[R->p][i];
    if (ins->op != SCHED_OP_FWD && ins->op != SCHED_OP_BWD) continue;
    int j = ins->chunk / (int)S->PP, mb = ins->mb; /* the local chunk */
    R->cur_chunk = ins->chunk;
    R->cur_mb = mb;
    Interp *in = R->in[j];
    const AdResult *ad = R->ad[j];
    const char *err = NULL;
    if (ins->op == SCHED_OP_FWD) {
      int64_t g = (int64_t)mb * L->dp + R->d; /* the global micro-batch */
      for (int k = 0; k < m->ninputs; k++) interp_set_input(in, k, S->inputs[k] + g * S->input_row[k] * L->micro_batch);
      frames[j * M + mb] = interp_forward(in, ad->step, &s, 1, &err);
      if (!frames[j * M + mb]) rank_fail(R, "forward", ins->chunk, mb, err);
    } else {
      InterpFrame *f = frames[j * M + mb];
      frames[j * M + mb] = NULL;
      if (!f) {
        rank_fail(R, "backward", ins->chunk, mb, "its forward has not run");
        break;
      }
      const IrGraph *sg = ad->m->graphs[ad->step];
      InterpTensor *outs = calloc((size_t)sg->noutputs, sizeof(InterpTensor));
      if (interp_backward(f, outs, &err) == 0) {
        if (ins->chunk == S->K - 1) R->loss_sum += outs[0].data[0];
      } else {
        rank_fail(R, "backward", ins->chunk, mb, err);
      }
      for (int k = 0; k < sg->noutputs; k++) free(outs[k].data);
      free(outs);
    }
  }
  for (int k = 0; k < R->nlocal * M; k++) interp_frame_free(frames[k]);
  free(frames);
  /* the data-parallel synchronisation, once per step, chunk by chunk in the
   * same order on every member of the group */
  for (int j = 0; j < R->nlocal && !R->err; j++) {
    const char *err = rank_sync(R, j);
    if (err) rank_fail(R, "dp.sync", R->p + j * (int)S->PP, -1, err);
  }
  return NULL;
}

static int fail(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

static int find_param(const IrModule *m, const char *name) {
  for (int i = 0; i < m->nparams; i++)
    if (!strcmp(m->params[i].name, name)) return i;
  return -1;
}

/* Copies between a logical tensor and the piece of it a rank holds: piece
 * i1 along the first split, i2 along the second (core/shard.h). */
static void shard_copy(const IrParam *lp, int i1, int i2, double *logical, double *local, int to_logical) {
  ShardSplit s = shard_whole();
  if (lp->split_axis >= 0)
    s.axis = lp->split_axis, s.parts = (int)(lp->full_dims[lp->split_axis] / lp->dims[lp->split_axis]), s.index = i1;
  if (lp->split2_axis >= 0)
    s.axis2 = lp->split2_axis, s.parts2 = (int)(lp->full_dims[lp->split2_axis] / lp->dims[lp->split2_axis]), s.index2 = i2;
  double *whole = logical;
  size_t row = 1, rows = lp->rank ? (size_t)lp->full_dims[0] : 1, kept = rows;
  for (int d = 1; d < lp->rank; d++) row *= (size_t)lp->full_dims[d];
  if (lp->logical_rows > 0) {
    /* a padded vocabulary: the logical tensor is its first rows, the rest zeros */
    kept = (size_t)lp->logical_rows;
    whole = calloc(rows * row, sizeof(double));
    if (!whole) abort();
    memcpy(whole, logical, kept * row * sizeof(double));
  }
  if (to_logical) shard_insert(whole, (int)sizeof(double), lp->rank, lp->full_dims, &s, local);
  else shard_extract(whole, (int)sizeof(double), lp->rank, lp->full_dims, &s, local);
  if (whole != logical) {
    if (to_logical) memcpy(logical, whole, kept * row * sizeof(double));
    free(whole);
  }
}

/* Which shard of a split parameter rank R holds: its place in the group
 * (and for an expert shard's second split, its tensor rank). */
static int shard_index(const Rank *R, const IrParam *lp) {
  const Sim *S = R->S;
  if (!ir_param_is_expert(lp)) return R->t;
  return S->fold ? R->t + (int)S->L->tp * (R->d % S->ep_dp) : R->d % S->ep;
}

/* A parameter as the rank would hold it without ZeRO-3's pieces: its
 * tensor-parallel shard of the logical tensor. */
static IrParam tp_view(const IrParam *lp) {
  IrParam v = *lp;
  if (v.dp_shards) {
    v.rank = v.dp_rank;
    memcpy(v.dims, v.dp_dims, sizeof v.dims);
  }
  return v;
}

/* Copies between a flattened tensor of numel values and data-parallel rank
 * d's piece of it: values [d*s, (d+1)*s), zero beyond the end (dpsync.h). */
static void piece_copy(double *whole, int64_t numel, int64_t s, int d, double *piece, int to_whole) {
  int64_t at = (int64_t)d * s, n = at >= numel ? 0 : (numel - at < s ? numel - at : s);
  if (to_whole) {
    memcpy(whole + at, piece, sizeof(double) * (size_t)n);
  } else {
    memcpy(piece, whole + at, sizeof(double) * (size_t)n);
    memset(piece + n, 0, sizeof(double) * (size_t)(s - n));
  }
}

/* Every rank starts from its shard of the logical weights (with ZeRO-3, its
 * data-parallel piece of that shard). */
static void load_weights(Rank *R, Interp *in, Interp *gi, const IrModule *global, const IrModule *cm) {
  double *whole = NULL;
  for (int p = 0; p < cm->nparams; p++) {
    const IrParam *lp = &cm->params[p];
    int gp = find_param(global, lp->name);
    IrParam v = tp_view(lp);
    int64_t numel = 1;
    for (int k = 0; k < v.rank; k++) numel *= v.dims[k];
    for (int64_t l = 0; gp >= 0 && l < ir_param_copies(lp); l++) {
      int64_t n;
      double *logical = interp_param(gi, gp, l, &n);
      double *local = interp_param(in, p, l, &n);
      if (!lp->dp_shards) {
        shard_copy(lp, shard_index(R, lp), R->t, logical, local, 0);
        continue;
      }
      whole = realloc(whole, sizeof(double) * (size_t)numel);
      int expert = ir_param_is_expert(lp);
      shard_copy(&v, shard_index(R, lp), R->t, logical, whole, 0);
      piece_copy(whole, numel, n, expert ? R->d / R->S->ep_dp : R->d, local, 0);
    }
  }
  free(whole);
}

/* The logical gradients from dp.sync's outputs: tensor shards side by side;
 * whole tensors from tensor and context rank 0; chunks add (a tied weight is
 * used by two). Zero 0/1: every replica holds the same mean (checked, bit for
 * bit); zero 2/3: data-parallel rank d holds piece d, put in place here. */
static const char *assemble_grads(Sim *S, const IrModule *global, SimResult *out) {
  const SimLayout *L = S->L;
  const char *err = NULL;
  double *tmp = NULL, *local = NULL;
  for (int i = 0; i < S->nranks && !err; i++) {
    Rank *R = &S->ranks[i];
    if (R->x != 0 || R->d != 0) continue;
    for (int j = 0; j < R->nlocal && !err; j++) {
      const DpSync *s = R->sync[j];
      for (int k = 0; k < s->nargs && !err; k++) {
        const IrParam *lp = &s->m->params[s->param[k]];
        int expert = ir_param_is_expert(lp);
        /* each tensor rank's own piece, or rank 0's copy of a whole tensor or expert shard
         * (folded, tensor rank 0 gathers every member's experts below) */
        if (R->t != 0 && (lp->split_axis < 0 || (expert && (lp->split2_axis < 0 || S->fold)))) continue;
        int gpi = find_param(global, lp->name);
        const IrParam *gp = &global->params[gpi];
        IrParam v = tp_view(lp);
        int64_t n = ir_param_numel(gp), ln = s->numel[k], piece = s->piece[k];
        tmp = realloc(tmp, sizeof(double) * (size_t)n);
        local = realloc(local, sizeof(double) * (size_t)ln);
        for (int64_t l = 0; l < s->copies[k] && !err; l++) {
          memset(tmp, 0, sizeof(double) * (size_t)n);
          if (expert && S->fold) {
            /* folded: member e of the first expert group is tensor rank e % tp of
             * replica e / tp; replica d + ep_dp q holds its piece q (zero 2/3) or
             * the same shard (which must agree) */
            for (int e = 0; e < S->ep && !err; e++) {
              int te = e % (int)L->tp, de = e / (int)L->tp;
              for (int d = de; d < L->dp && !err; d += S->ep_dp) {
                const double *got = S->ranks[rank_index(S, d, R->p, te, 0)].synced[j][k].data + l * piece;
                if (s->zero >= 2) piece_copy(local, ln, piece, d / S->ep_dp, (double *)got, 1);
                else if (d == de) memcpy(local, got, sizeof(double) * (size_t)ln);
                else if (memcmp(local, got, sizeof(double) * (size_t)ln))
                  err = "the replicas of an expert shard hold different gradients after dp.sync";
              }
              shard_copy(&v, e, 0, tmp, local, 1);
            }
          } else if (expert && s->zero >= 2) {
            /* replica d holds piece d / ep of expert shard d % ep */
            for (int e = 0; e < S->ep; e++) {
              for (int d = e; d < L->dp; d += S->ep)
                piece_copy(local, ln, piece, d / S->ep,
                           S->ranks[rank_index(S, d, R->p, R->t, 0)].synced[j][k].data + l * piece, 1);
              shard_copy(&v, e, R->t, tmp, local, 1);
            }
          } else if (expert) {
            /* replica d holds expert shard d % ep; the replicas of a shard agree */
            for (int d = 0; d < L->dp && !err; d++) {
              const double *got = S->ranks[rank_index(S, d, R->p, R->t, 0)].synced[j][k].data + l * piece;
              const double *first = S->ranks[rank_index(S, d % S->ep, R->p, R->t, 0)].synced[j][k].data + l * piece;
              if (d < S->ep) shard_copy(&v, d, R->t, tmp, (double *)got, 1);
              else if (memcmp(first, got, sizeof(double) * (size_t)ln))
                err = "the replicas of an expert shard hold different gradients after dp.sync";
            }
          } else {
            for (int d = 0; d < L->dp; d++) {
              const double *got = S->ranks[rank_index(S, d, R->p, R->t, 0)].synced[j][k].data + l * piece;
              if (s->zero >= 2) piece_copy(local, ln, piece, d, (double *)got, 1);
              else if (d == 0) memcpy(local, got, sizeof(double) * (size_t)ln);
              else if (memcmp(local, got, sizeof(double) * (size_t)ln))
                err = "data-parallel replicas hold different gradients after dp.sync";
            }
            shard_copy(&v, R->t, R->t, tmp, local, 1);
          }
          double *dst = out->grads[gpi] + (s->first[k] + l) * n;
          for (int64_t q = 0; q < n; q++) dst[q] += tmp[q];
        }
      }
    }
  }
  free(tmp);
  free(local);
  return err;
}

int sim_step(const SemModel *model, const SimLayout *L, uint64_t seed, double *const *inputs, SimResult *out, char *err,
             size_t errlen) {
  memset(out, 0, sizeof *out);
  Arena *arena = arena_new();
  FILE *sink = fopen("/dev/null", "w");
  Diag *diag = diag_new(sink ? sink : stderr);
  int rc = -1;
  Sim S;
  memset(&S, 0, sizeof S);
  S.L = L;
  S.inputs = inputs;
  Interp *gi = NULL;
  LowerOptions lo = {0, L->materialize_attention, 0};
  IrModule *global = lower_model_with(arena, diag, model, L->micro_batch, &lo);
  if (!global) {
    fail(err, errlen, "the model does not lower");
    goto done;
  }
  int fold = L->ep_fold && L->tp > 1 && L->ep > 1;
  /* the data-parallel ranks in an expert group (dp.sync's sums and shards of expert shards go over dp / ep_dp) */
  int64_t ep_dp = L->ep > 1 ? (fold ? L->ep / L->tp : L->ep) : 1;
  const char *fold_why = NULL;
  /* as compile: dropless experts over their rows, expert-major slots, folded sequences */
  if (moe_as_compiled(global, L->ep, fold ? L->tp : 1, L->cp, 0, &fold_why) < 0) {
    fail(err, errlen, "%s", fold_why);
    goto done;
  }
  S.global = global;
  SpmdSpec spec = {L->tp, L->cp, L->sp, model->seq_len, L->ep, L->vocab_pad, L->fused_ce, fold, L->cp_ring};
  IrModule *part = spmd_partition(arena, diag, global, &spec);
  S.PP = L->pp;
  S.K = L->pp * (L->vpp > 0 ? L->vpp : 1);
  const char *split_why = "?";
  int64_t *split = part ? plan_chunk_layers(arena, model, L->micro_batch, L->tp, L->cp, L->sp, L->recompute, S.K, &split_why) : NULL;
  if (part && !split) {
    fail(err, errlen, "the pipeline stages cannot be split: %s", split_why);
    goto done;
  }
  PipeResult *pr = part ? pipe_split(arena, diag, part, S.K, split) : NULL;
  if (!pr) {
    fail(err, errlen, "the layout does not partition this model");
    goto done;
  }
  gi = interp_new(global);
  interp_init_params(gi, seed);
  S.input_row = calloc((size_t)global->ninputs + 1, sizeof(int64_t));
  for (int i = 0; i < global->ninputs; i++) {
    int64_t n = 1;
    for (int k = 1; k < global->inputs[i].rank; k++) n *= global->inputs[i].dims[k];
    S.input_row[i] = n;
  }
  /* chunk programs */
  IrModule **cms = arena_alloc(arena, sizeof(IrModule *) * (size_t)S.K);
  AdResult **ads = arena_alloc(arena, sizeof(AdResult *) * (size_t)S.K);
  DpSync **syncs = arena_alloc(arena, sizeof(DpSync *) * (size_t)S.K);
  for (int c = 0; c < S.K; c++) {
    cms[c] = pipe_chunk_module(arena, pr, c);
    if (L->zero == 3 && !(cms[c] = dpsync_shard_params(arena, diag, cms[c], L->dp, ep_dp))) {
      fail(err, errlen, "chunk %d: its parameters do not shard over dp", c);
      goto done;
    }
    const char *why = NULL;
    ads[c] = ad_build_layers(cms[c], L->recompute, model->layout.recompute_layers, &why);
    if (!ads[c]) {
      fail(err, errlen, "chunk %d does not differentiate: %s", c, why ? why : "?");
      goto done;
    }
    if (!(syncs[c] = dpsync_build(ads[c], L->dp, L->zero, ep_dp, &why))) {
      fail(err, errlen, "chunk %d: no gradient synchronisation: %s", c, why ? why : "?");
      goto done;
    }
    if (ir_verify(cms[c], NULL) || ir_verify_pipeline_cut(cms[c]->graphs[ads[c]->step], NULL)) {
      fail(err, errlen, "chunk %d does not verify", c);
      goto done;
    }
  }
  /* the pipeline's instruction lists */
  {
    int pp = (int)S.PP, v = (int)(S.K / S.PP), mm = (int)L->num_micro;
    Schedule kind = v > 1 ? SCHED_INTERLEAVED : L->schedule;
    char why[256];
    if (sched_build(&S.prog, kind, pp, mm, v, why, sizeof why) && sched_build_sequential(&S.prog, pp, mm, v)) {
      fail(err, errlen, "no instruction lists for the pipeline: %s", why);
      goto done;
    }
  }
  /* ranks, groups, mailboxes */
  S.nranks = (int)(L->dp * S.PP * L->tp * L->cp);
  S.ep = L->ep > 1 ? (int)L->ep : 1;
  S.fold = fold;
  S.ep_dp = (int)ep_dp;
  S.ranks = calloc((size_t)S.nranks, sizeof(Rank));
  S.tp_groups = calloc((size_t)S.nranks, sizeof(Group));
  S.cp_groups = calloc((size_t)S.nranks, sizeof(Group));
  S.dp_groups = calloc((size_t)S.nranks, sizeof(Group));
  S.ep_groups = calloc((size_t)S.nranks, sizeof(Group));
  S.edp_groups = calloc((size_t)S.nranks, sizeof(Group));
  S.boxes = calloc((size_t)S.nranks * (size_t)S.nranks, sizeof(Mailbox));
  for (int i = 0; i < S.nranks; i++) {
    group_init(&S.tp_groups[i], (int)L->tp);
    group_init(&S.cp_groups[i], (int)L->cp);
    group_init(&S.dp_groups[i], (int)L->dp);
    group_init(&S.ep_groups[i], S.ep);
    group_init(&S.edp_groups[i], (int)L->dp / S.ep_dp);
  }
  for (int i = 0; i < S.nranks * S.nranks; i++) {
    pthread_mutex_init(&S.boxes[i].mu, NULL);
    pthread_cond_init(&S.boxes[i].cv, NULL);
  }
  for (int d = 0; d < L->dp; d++)
    for (int pr_ = 0; pr_ < S.PP; pr_++)
      for (int t = 0; t < L->tp; t++)
        for (int x = 0; x < L->cp; x++) {
          int ri = rank_index(&S, d, pr_, t, x);
          Rank *R = &S.ranks[ri];
          R->S = &S;
          R->d = d, R->p = pr_, R->t = t, R->x = x;
          R->index = ri;
          R->nlocal = (int)(S.K / S.PP);
          R->in = calloc((size_t)R->nlocal, sizeof(Interp *));
          R->ad = calloc((size_t)R->nlocal, sizeof(AdResult *));
          R->sync = calloc((size_t)R->nlocal, sizeof(DpSync *));
          R->synced = calloc((size_t)R->nlocal, sizeof(InterpTensor *));
          for (int j = 0; j < R->nlocal; j++) {
            int c = pr_ + j * (int)S.PP;
            R->ad[j] = ads[c];
            R->sync[j] = syncs[c];
            Interp *in = R->in[j] = interp_new(cms[c]);
            InterpComm comm;
            memset(&comm, 0, sizeof comm);
            for (int g = 0; g < IRG_COUNT; g++) comm.size[g] = 1;
            comm.rank[IRG_TP] = t, comm.size[IRG_TP] = (int)L->tp;
            comm.rank[IRG_CP] = x, comm.size[IRG_CP] = (int)L->cp;
            comm.rank[IRG_PP] = c, comm.size[IRG_PP] = (int)S.K;
            comm.rank[IRG_DP] = d, comm.size[IRG_DP] = (int)L->dp;
            comm.rank[IRG_EP] = fold ? t + (int)L->tp * (d % S.ep_dp) : d % S.ep, comm.size[IRG_EP] = S.ep;
            comm.rank[IRG_EDP] = d / S.ep_dp, comm.size[IRG_EDP] = (int)L->dp / S.ep_dp;
            comm.ctx = R;
            comm.all_reduce = sim_all_reduce;
            comm.all_gather = sim_all_gather;
            comm.send = sim_send;
            comm.recv = sim_recv;
            interp_set_comm(in, &comm);
            interp_init_params(in, seed);
            load_weights(R, in, gi, global, cms[c]);
          }
        }
  pthread_t *th = calloc((size_t)S.nranks, sizeof(pthread_t));
  for (int i = 0; i < S.nranks; i++) pthread_create(&th[i], NULL, rank_main, &S.ranks[i]);
  for (int i = 0; i < S.nranks; i++) pthread_join(th[i], NULL);
  free(th);
  for (int i = 0; i < S.nranks; i++)
    if (S.ranks[i].err) {
      fail(err, errlen, "%s", S.ranks[i].err);
      goto done;
    }
  out->nparams = global->nparams;
  out->names = calloc((size_t)global->nparams + 1, sizeof(char *));
  out->numel = calloc((size_t)global->nparams + 1, sizeof(int64_t));
  out->grads = calloc((size_t)global->nparams + 1, sizeof(double *));
  out->nranks = S.nranks;
  for (int p = 0; p < global->nparams; p++) {
    const IrParam *gp = &global->params[p];
    int64_t n = ir_param_numel_all(gp);
    out->names[p] = strdup(gp->name);
    out->numel[p] = n;
    out->grads[p] = calloc((size_t)n, sizeof(double));
  }
  const char *why = assemble_grads(&S, global, out);
  if (why) {
    fail(err, errlen, "%s", why);
    goto done;
  }
  for (int i = 0; i < S.nranks; i++) {
    const Rank *R = &S.ranks[i];
    if (R->p == sched_chunk_rank((int)S.PP, (int)S.K - 1) && R->t == 0 && R->x == 0) out->loss += R->loss_sum / (double)L->num_micro / (double)L->dp;
  }
  rc = 0;
done:
  if (S.ranks)
    for (int i = 0; i < S.nranks; i++) {
      Rank *R = &S.ranks[i];
      for (int j = 0; R->in && j < R->nlocal; j++) {
        interp_free(R->in[j]);
        for (int k = 0; R->synced && R->synced[j] && k < R->sync[j]->nargs; k++) free(R->synced[j][k].data);
        if (R->synced) free(R->synced[j]);
      }
      free(R->in);
      free(R->ad);
      free(R->sync);
      free(R->synced);
    }
  if (S.prog.len) sched_free(&S.prog);
  if (S.tp_groups)
    for (int i = 0; i < S.nranks; i++) {
      group_destroy(&S.tp_groups[i]);
      group_destroy(&S.cp_groups[i]);
      group_destroy(&S.dp_groups[i]);
      group_destroy(&S.ep_groups[i]);
      group_destroy(&S.edp_groups[i]);
    }
  if (S.boxes)
    for (int i = 0; i < S.nranks * S.nranks; i++) {
      for (Letter *l = S.boxes[i].head; l;) {
        Letter *next = l->next;
        free(l->data);
        free(l);
        l = next;
      }
      pthread_mutex_destroy(&S.boxes[i].mu);
      pthread_cond_destroy(&S.boxes[i].cv);
    }
  free(S.ranks);
  free(S.tp_groups);
  free(S.cp_groups);
  free(S.dp_groups);
  free(S.ep_groups);
  free(S.edp_groups);
  free(S.boxes);
  free(S.input_row);
  interp_free(gi);
  diag_free(diag);
  if (sink) fclose(sink);
  arena_free(arena);
  if (rc) sim_result_free(out);
  return rc;
}

void sim_result_free(SimResult *r) {
  for (int i = 0; i < r->nparams; i++) {
    free((char *)r->names[i]);
    free(r->grads[i]);
  }
  free(r->names);
  free(r->numel);
  free(r->grads);
  memset(r, 0, sizeof *r);
}

/* ---- the per-rank program of a layout ---- */

SimRankProgram *sim_rank_program(Arena *arena, Diag *diag, const SemModel *model, const SimLayout *L, int chunk,
                                 const PrecTarget *target, const char **err) {
  const char *e = NULL;
  SimRankProgram *r = arena_alloc(arena, sizeof *r);
  LowerOptions lo = {0, L->materialize_attention, 0};
  r->global = lower_model_with(arena, diag, model, L->micro_batch, &lo);
  const char *fold_why = NULL;
  if (r->global && moe_as_compiled(r->global, L->ep, L->ep_fold ? L->tp : 1, L->cp, 0, &fold_why) < 0) {
    *err = fold_why;
    return NULL;
  }
  SpmdSpec spec = {L->tp > 0 ? L->tp : 1, L->cp > 0 ? L->cp : 1, L->sp == 1, model->seq_len, L->ep > 0 ? L->ep : 1, L->vocab_pad, L->fused_ce,
                   L->ep_fold, L->cp_ring};
  IrModule *part = r->global ? spmd_partition(arena, diag, r->global, &spec) : NULL;
  int64_t chunks = (L->pp > 0 ? L->pp : 1) * (L->vpp > 0 ? L->vpp : 1);
  const char *split_why = NULL;
  int64_t *split = part ? plan_chunk_layers(arena, model, L->micro_batch, L->tp, L->cp, L->sp == 1, L->recompute, chunks,
                                            &split_why)
                        : NULL;
  PipeResult *pr = split ? pipe_split(arena, diag, part, chunks, split) : NULL;
  if (!r->global) e = "the model does not lower";
  else if (part && !split) e = split_why;
  else if (!pr) e = "the layout does not partition this model";
  else if (chunk < 0 || chunk >= pr->nchunks) e = "no such pipeline chunk";
  if (!e) {
    r->chunk = chunk;
    r->nchunks = pr->nchunks;
    r->module = pipe_chunk_module(arena, pr, chunk);
    const char *why = NULL;
    r->ad = ad_build_layers(r->module, L->recompute, model->layout.recompute_layers, &why);
    if (!r->ad) e = why ? arena_printf(arena, "the chunk does not differentiate: %s", why) : "the chunk does not differentiate";
    else if (prec_apply(r->module, r->ad, prec_storage(model->train.precision), target, &why) < 0)
      e = arena_printf(arena, "16-bit storage: %s", why ? why : "?");
    else if (ir_verify(r->module, NULL)) e = "the differentiated chunk does not verify";
  }
  if (e) {
    if (err) *err = e;
    return NULL;
  }
  return r;
}
