/* train.c - the training loop (see train.h). */
#include "train.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "builtin.h"
#include "prof.h"
#include "program_cuda.h"
#include "ckpt.h"
#include "gemm16.h"
#include "half.h"
#include "init.h"
#include "optim.h"
#include "par.h"

void train_options_defaults(TrainOptions *o) {
  memset(o, 0, sizeof *o);
  o->steps = o->seed = o->log_every = o->ckpt_every = o->ckpt_keep = o->stop_at = -1;
  o->ckpt_async = -1;
  o->progress = TRAIN_PROGRESS_AUTO;
  o->out = stdout;
}

/* A checkpoint written by a background thread (train.checkpoint.async):
 * the thread owns the gathered tensors and frees them. */
typedef struct {
  char *dir;
  int64_t step;
  CkptTensor *t;
  int n;
  json_t *info;
  int keep;
  int rc;
  double seconds;
  RtErr err;
  char manifest[4096];
  int done; /* set (atomically) when the thread has finished */
} SaveJob;

typedef struct {
  const Artifact *a;
  Comm *c;
  const TrainOptions *o;
  TrainCtx ctx;
  float *pool[4]; /* data, grad (pool_cap values); m, v (the owned own_len values) */
  uint16_t *pool16[2]; /* train.moments = bf16: m, v in bf16 instead (pool[2], pool[3] NULL) */
  int64_t pool_len;
  /* ZeRO (docs/runtime.md, "ZeRO"): the pools padded to pool_cap, a multiple
   * of 16 x dp; data-parallel member r owns values [own_lo, own_lo + own_len),
   * own_len = pool_cap / dp. At zero 0 it owns them all (own_len = pool_len). */
  int zero;
  int64_t pool_cap, own_lo, own_len;
  int64_t expert_lo; /* pool values [expert_lo, pool_len) are expert shards (reduced over edp) */
  /* ZeRO with expert parallelism: the expert region [expert_lo, pool_cap) is
   * sharded over the expert-data-parallel group instead (its members hold the
   * same experts): this member owns [own2_lo, own2_lo + own2_len) of it, kept
   * in the state pools after the own_len values of the rest. 0: none. */
  int64_t own2_lo, own2_len;
  int64_t *offset;         /* each tensor's first value in the pools */
  unsigned char *norm_rep; /* this rank's copy of the tensor is the one its tp / cp group counts in the norm */
  unsigned char *count;    /* resident: the tensors this rank counts in the norm */
  float *grad_own;         /* zero >= 2: the dp-reduced gradient of the owned values */
  float *master;           /* zero 3: the owned parameters, the only copy between steps */
  TrainShards shards;      /* the above for a resident program (TrainCtx.shards) */
  const TrainProgram *prog;
  void *self, *dl;
  int resident; /* the program keeps the parameters, gradients and optimizer state (TrainProgram.resident) */
  DataLoader *loader;
  DataLoader *eval_loader; /* --eval-every's validation data */
  DataBatch *mbuf;   /* the step's micro-batches, copied out of the loader */
  const DataBatch **mptr;
  OptimConfig opt;
  int64_t steps, seed, log_every, ckpt_every, keep, start_step, data_start;
  const char *ckpt_dir;
  int async, me, nmicro;
  CommCompressor z;
  FILE *metrics, *out;
  int tty;
  /* async checkpoint */
  pthread_t thr;
  int thr_live;
  SaveJob *job;
  char last_ckpt[4096];
  /* fp16's loss scale (docs/runtime.md, "Loss scaling"): the step's seed is
   * multiplied by scale and the gradients divided by it before the norm and
   * the update; a step whose gradients are not finite is skipped. */
  int scaling, scale_dynamic;
  double scale;
  int64_t scale_good;     /* finite steps since the scale last changed */
  int64_t scale_window;   /* grow after this many */
  int64_t skipped;        /* steps skipped, since step 0 */
  int64_t updates;        /* optimizer updates applied (Adam's t) */
  /* hpdlrun --profile (docs/runtime.md, "Profiling"): this rank's timeline;
   * NULL when off */
  Prof *prof;
  TrainProfiler profiler; /* the program's way into it (ctx.prof) */
} Run;

/* Dynamic loss scaling as PyTorch's torch.amp.GradScaler does it by default
 * (init_scale 2^16, growth_factor 2, backoff_factor 0.5, growth_interval
 * 2000); a scale that would fall below 1 ends the run as diverged, as
 * Megatron-LM's --min-loss-scale (default 1) bounds it. Micikevicius et al.
 * 2018, "Mixed Precision Training", section 3.2. */
#define LOSS_SCALE_INIT 65536.0
#define LOSS_SCALE_WINDOW 2000
#define LOSS_SCALE_MIN 1.0

/* ---- agreement and fatal errors ---- */

/* A collective failure leaves the ranks out of step: stop them all. */
static void fatal(Run *R, const char *what, const RtErr *e) {
  fprintf(stderr, "hpdlrun: rank %d: error: %s%s%s\n", R->me, what, e ? ": " : "", e ? e->msg : "");
  fflush(stderr);
  rt_note_reported();
  R->c->ops->abort(R->c, 1);
  exit(1);
}

/* Every rank says whether it failed; returns the lowest failing rank, or
 * -1 when all succeeded. */
static int agree(Run *R, int failed) {
  double v = failed ? (double)(R->c->world_size - R->me) : 0.0;
  RtErr e;
  if (comm_all_reduce(R->c, COMM_WORLD, COMM_F64, COMM_MAX, &v, 1, &e) < 0) fatal(R, "agreeing on the status", &e);
  return v > 0 ? R->c->world_size - (int)v : -1;
}

/* ---- tensors and pools ---- */

static int64_t round16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* How many pieces p is cut into on this layout along its first (second)
 * split; 1 where it is not. */
static int split_parts(const Comm *c, const ArtParam *p, int second) {
  int axis = second ? p->split2_axis : p->split_axis;
  CommGroup g = second ? p->split2_group : p->split_group;
  return axis >= 0 && c->size[g] > 1 ? c->size[g] : 1;
}

/* Piece q of p's split_parts(0) x split_parts(1) pieces (row-major). */
static ShardSplit piece_split(const Comm *c, const ArtParam *p, int q) {
  int n1 = split_parts(c, p, 0), n2 = split_parts(c, p, 1);
  ShardSplit s = shard_whole();
  if (n1 > 1) s.axis = p->split_axis, s.parts = n1, s.index = q / n2;
  if (n2 > 1) s.axis2 = p->split2_axis, s.parts2 = n2, s.index2 = q % n2;
  return s;
}

/* The piece this rank holds. */
static int my_piece(const Comm *c, const ArtParam *p) {
  int n2 = split_parts(c, p, 1);
  return (split_parts(c, p, 0) > 1 ? c->rank[p->split_group] : 0) * n2 + (n2 > 1 ? c->rank[p->split2_group] : 0);
}

/* Whether p is split over group g on this layout. */
static int split_over(const Comm *c, const ArtParam *p, CommGroup g) {
  return (split_parts(c, p, 0) > 1 && p->split_group == g) || (split_parts(c, p, 1) > 1 && p->split2_group == g);
}

/* Whether this rank's copy of p is the one its tensor group counts in norms:
 * p split over the tensor group, or over an expert group folded over it (the
 * tensor ranks hold different experts), or this is tensor rank 0. */
static int tp_counts(const Comm *c, const ArtParam *p) {
  int folded = comm_layout_folded(&c->layout) && split_over(c, p, COMM_EP);
  return split_over(c, p, COMM_TP) || folded || c->coords.tp == 0;
}

/* This rank's copy of t is the first among the data-parallel copies (counted
 * once in norms): member 0 of the data-parallel group, or for an expert shard
 * member 0 of the expert-data-parallel group that holds it. */
static int dp_first(const Comm *c, const TrainTensor *t) { return train_tensor_is_expert(t) ? c->rank[COMM_EDP] == 0 : c->coords.dp == 0; }

static int make_tensors(Run *R, RtErr *e) {
  const Artifact *a = R->a;
  Comm *c = R->c;
  int n = 0;
  for (int i = 0; i < a->nparams; i++)
    for (int64_t l = 0; l < a->params[i].count; l++)
      if (a->params[i].stages[l] == c->coords.pp) n++;
  TrainTensor *t = rt_calloc((size_t)(n ? n : 1), sizeof *t);
  if (!t) return rt_fail(e, "out of memory");
  R->ctx.tensors = t;
  R->ctx.ntensors = n;
  int k = 0;
  for (int i = 0; i < a->nparams; i++) {
    const ArtParam *p = &a->params[i];
    for (int64_t l = 0; l < p->count; l++) {
      if (p->stages[l] != c->coords.pp) continue;
      TrainTensor *x = &t[k++];
      x->param = p;
      x->layer = l;
      if (artifact_param_name(p, l, x->name, sizeof x->name) < 0) return rt_fail(e, "parameter name too long: %s", p->name);
      x->rank = p->rank;
      x->split = piece_split(c, p, my_piece(c, p));
      char why[160];
      if (shard_dims(p->rank, p->shape, &x->split, x->shape, why, sizeof why) < 0)
        return rt_fail(e, "parameter %s: %s", x->name, why);
      x->numel = 1;
      for (int d = 0; d < p->rank; d++) x->numel *= x->shape[d];
      /* Each logical value is counted once in the norm: by data-parallel
       * replica 0, and by member 0 of any group it is replicated over. */
      int tp_ok = tp_counts(c, p);
      int cp_ok = split_over(c, p, COMM_CP) || c->coords.cp == 0;
      x->in_norm = dp_first(c, x) && tp_ok && cp_ok;
    }
  }
  int dp = c->size[COMM_DP], edp = c->size[COMM_EDP];
  R->offset = rt_calloc((size_t)(n ? n : 1), sizeof *R->offset);
  R->norm_rep = rt_calloc((size_t)(n ? n : 1), 1);
  if (!R->offset || !R->norm_rep) return rt_fail(e, "out of memory");
  /* Expert shards (split over the expert group) after everything else: their
   * gradients are summed over the expert-data-parallel group, the rest over
   * the data-parallel group, each range in one call. Under ZeRO each range
   * is padded to 16 x its group's members, so every slice stays 64-byte
   * aligned. */
  int two = R->zero > 0 && c->size[COMM_EP] > 1;
  int64_t off = 0, unit = 16 * (int64_t)dp, unit2 = 16 * (int64_t)(edp > 0 ? edp : 1);
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) {
      if (two) off = (off + unit - 1) / unit * unit;
      R->expert_lo = off;
    }
    for (int i = 0; i < n; i++) {
      if (train_tensor_is_expert(&t[i]) != pass) continue;
      R->offset[i] = off;
      off += round16(t[i].numel);
    }
  }
  int64_t len = R->pool_len = off;
  if (two) {
    int64_t b = off - R->expert_lo;
    b = (b + unit2 - 1) / unit2 * unit2;
    R->pool_cap = R->expert_lo + b;
    R->own_len = R->expert_lo / dp;
    R->own_lo = (int64_t)c->rank[COMM_DP] * R->own_len;
    R->own2_len = b / (edp > 0 ? edp : 1);
    R->own2_lo = R->expert_lo + (int64_t)c->rank[COMM_EDP] * R->own2_len;
  } else if (R->zero > 0) {
    R->pool_cap = (len + unit - 1) / unit * unit;
    if (R->pool_cap == 0) R->pool_cap = unit;
    R->own_len = R->pool_cap / dp;
    R->own_lo = (int64_t)c->rank[COMM_DP] * R->own_len;
  } else {
    R->pool_cap = R->own_len = len;
    R->own_lo = 0;
  }
  int64_t owned = R->own_len + R->own2_len; /* values of the state pools */
  int want_m = R->opt.kind == OPTIM_ADAMW || R->opt.momentum != 0, want_v = R->opt.kind == OPTIM_ADAMW;
  /* More than the machine has is refused before anything is allocated: an
   * allocation of terabytes could otherwise succeed (overcommit) and end in
   * the kernel's OOM killer mid-step, not in a message. */
  double state = 4.0 * ((double)R->pool_cap * 2 + (double)(R->zero >= 2 ? owned : 0) + (double)(R->zero >= 3 ? owned : 0)) +
                 (R->opt.moments16 ? 2.0 : 4.0) * (double)owned * (want_m + want_v);
  int on_gpu = R->a->target && !strcmp(R->a->target, "cuda"); /* its arena is the device's */
  double arena = on_gpu || R->me >= R->a->nranks ? 0 : (double)R->a->ranks[R->me].arena_bytes;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int on_node = c->node_ranks > 0 ? c->node_ranks : 1;
  double have = pages > 0 && page > 0 ? (double)pages * (double)page / on_node : 0;
  if (have > 0 && state + arena > have)
    return rt_fail(e,
                   "this rank needs %.1f GiB (parameters, gradients and optimizer state %.1f GiB, the program's arena %.1f GiB), "
                   "more than the %.1f GiB of memory that each of the node's %d rank%s has: spread the model over more ranks "
                   "(--tp, --pp, --dp with --zero) or make it smaller (hpdlc plan shows the memory per rank)",
                   (state + arena) / 1073741824.0, state / 1073741824.0, arena / 1073741824.0, have / 1073741824.0, on_node,
                   on_node == 1 ? "" : "s");
  /* the blocks come zeroed from the system, unwritten: their pages are
   * faulted in here on the rank's threads (the parameters' by their
   * initialisation, also on them) */
  for (int p = 0; p < 4; p++) {
    if ((p == 2 && !want_m) || (p == 3 && !want_v)) continue;
    int64_t values = p < 2 ? R->pool_cap : owned;
    int half = p >= 2 && R->opt.moments16 && !on_gpu; /* a device program keeps its own (program_cuda.c) */
    size_t bytes = (size_t)(values ? values : 16) * (half ? sizeof(uint16_t) : sizeof(float));
    void *block = rt_alloc_aligned(bytes);
    if (!block) return rt_fail(e, "out of memory for the parameters (%" PRId64 " values per pool)", values);
    if (half) R->pool16[p - 2] = block;
    else R->pool[p] = block;
    if (p > 0) par_prefault(R->o->nthreads, block, bytes);
  }
  if (R->zero >= 2 && !(R->grad_own = rt_alloc_aligned((size_t)owned * sizeof(float))))
    return rt_fail(e, "out of memory for the reduced gradients (%" PRId64 " values)", owned);
  if (R->zero >= 3 && !(R->master = rt_alloc_aligned((size_t)owned * sizeof(float))))
    return rt_fail(e, "out of memory for the parameters' slice (%" PRId64 " values)", owned);
  par_prefault(R->o->nthreads, R->grad_own, R->grad_own ? (size_t)owned * sizeof(float) : 0);
  par_prefault(R->o->nthreads, R->master, R->master ? (size_t)owned * sizeof(float) : 0);
  for (int i = 0; i < n; i++) {
    off = R->offset[i];
    const ArtParam *p = t[i].param;
    int tp_ok = tp_counts(c, p);
    int cp_ok = split_over(c, p, COMM_CP) || c->coords.cp == 0;
    R->norm_rep[i] = tp_ok && cp_ok; /* in_norm without its dp condition: under ZeRO each dp member counts its slice */
    t[i].data = R->pool[0] + off;
    t[i].grad = R->pool[1] + off;
    /* Sharded moments are not per tensor: the update walks the owned range. */
    t[i].m = R->pool[2] && R->zero == 0 ? R->pool[2] + off : NULL;
    t[i].v = R->pool[3] && R->zero == 0 ? R->pool[3] + off : NULL;
  }
  return 0;
}

/* ---- ZeRO: the owned range ---- */

/* The pool values of tensor i this rank owns: [*lo, *hi); 0 when none. */
static int owned_part(const Run *R, int i, int64_t *lo, int64_t *hi) {
  int64_t a = R->offset[i], b = a + R->ctx.tensors[i].numel;
  int second = R->own2_len > 0 && a >= R->expert_lo; /* an expert shard, owned over edp */
  int64_t olo = second ? R->own2_lo : R->own_lo, olen = second ? R->own2_len : R->own_len;
  if (a < olo) a = olo;
  if (b > olo + olen) b = olo + olen;
  *lo = a;
  *hi = b;
  return b > a;
}

/* Where the state pools (m, v, grad_own, master) keep owned pool value j. */
static int64_t state_index(const Run *R, int64_t j) {
  return R->own2_len > 0 && j >= R->own2_lo ? R->own_len + (j - R->own2_lo) : j - R->own_lo;
}

/* Where the step's reduced gradient of pool value j lies. */
static float *grad_at(Run *R, int64_t j) { return R->grad_own ? R->grad_own + state_index(R, j) : R->pool[1] + j; }
/* Where the master weight of pool value j (an owned one) lies. */
static float *param_at(Run *R, int64_t j) { return R->master ? R->master + state_index(R, j) : R->pool[0] + j; }

/* zero 3, between steps: the owned slice is the parameters' only copy; the
 * whole-parameter pool is handed back to the system until the next gather. */
static void params_to_rest(Run *R) {
  if (!R->master) return;
  memcpy(R->master, R->pool[0] + R->own_lo, (size_t)R->own_len * sizeof(float));
  if (R->own2_len) memcpy(R->master + R->own_len, R->pool[0] + R->own2_lo, (size_t)R->own2_len * sizeof(float));
  rt_release_pages(R->pool[0], (size_t)R->pool_cap * sizeof(float));
}

/* The running statistics (state tensors) the step's forwards updated: data-
 * parallel member 0's to every member (DDP's broadcast of its buffers), so
 * the replicas agree (synchronised batch norm's agree already); at zero 3
 * also into the owned master slice, the only copy between steps. */
static int sync_state(Run *R, RtErr *e) {
  for (int i = 0; i < R->ctx.ntensors; i++) {
    TrainTensor *t = &R->ctx.tensors[i];
    if (!t->param->state) continue;
    if (R->c->size[COMM_DP] > 1 && comm_broadcast(R->c, COMM_DP, COMM_F32, t->data, t->numel, 0, e) < 0) return -1;
    int64_t lo, hi;
    if (R->master && owned_part(R, i, &lo, &hi)) memcpy(param_at(R, lo), R->pool[0] + lo, (size_t)(hi - lo) * sizeof(float));
  }
  return 0;
}

/* zero 3: every member's slice into the whole-parameter pool (once per step:
 * the program reads whole parameters). */
static int gather_params(Run *R, RtErr *e) {
  if (comm_all_gather(R->c, COMM_DP, COMM_F32, R->master, R->own_len, R->pool[0], e) < 0) return -1;
  return R->own2_len ? comm_all_gather(R->c, COMM_EDP, COMM_F32, R->master + R->own_len, R->own2_len, R->pool[0] + R->expert_lo, e)
                     : 0;
}

/* Whether the run keeps optimizer state s (1: m or SGD's momentum, 2: v), in fp32 or bf16. */
static int has_state(const Run *R, int s) { return R->pool[1 + s] != NULL || R->pool16[s - 1] != NULL; }

/* The whole pool of state s (0 parameters, 1 m, 2 v) as this rank's tensors
 * lay it out, on data-parallel member 0 (the checkpoint's owner): the pool
 * itself when it is not sharded, else the members' slices sent to member 0
 * into *tmp (every member of the dp group calls this). NULL elsewhere. */
static const float *whole_state(Run *R, int s, float **tmp, RtErr *e) {
  *tmp = NULL;
  int sharded = s == 0 ? R->master != NULL : R->zero > 0;
  const float *own = s == 0 ? R->master : R->pool[1 + s];
  float *wide = NULL; /* bf16 moments in fp32: a checkpoint's tensors are logical fp32 */
  if (s > 0 && R->pool16[s - 1]) {
    int64_t owned = R->own_len + R->own2_len;
    if (!(wide = rt_alloc((size_t)(owned ? owned : 1) * sizeof(float)))) fatal(R, "out of memory gathering a checkpoint", NULL);
    for (int64_t j = 0; j < owned; j++) wide[j] = half_bf16_to_f32(R->pool16[s - 1][j]);
    own = wide;
    if (!sharded) { /* the owned values are the whole pool */
      *tmp = wide;
      return wide;
    }
  }
  if (!sharded) return s == 0 ? R->pool[0] : R->pool[1 + s];
  Comm *c = R->c;
  int dp = c->size[COMM_DP], r = c->rank[COMM_DP];
  float *all = NULL;
  if (r != 0) {
    if (comm_send(c, COMM_DP, COMM_F32, own, R->own_len, 0, 200 + s, e) < 0)
      fatal(R, "sending a ZeRO slice to the checkpoint writer", e);
  } else {
    if (!(all = rt_alloc((size_t)R->pool_cap * sizeof(float)))) fatal(R, "out of memory gathering a checkpoint", NULL);
    memcpy(all, own, (size_t)R->own_len * sizeof(float));
    for (int q = 1; q < dp; q++)
      if (comm_recv(c, COMM_DP, COMM_F32, all + (int64_t)q * R->own_len, R->own_len, q, 200 + s, e) < 0)
        fatal(R, "receiving a ZeRO slice for the checkpoint", e);
  }
  if (R->own2_len) {
    /* the expert region, gathered on the first member of each expert-data-
     * parallel group: the owner of its expert shards in a checkpoint */
    int edp = c->size[COMM_EDP], r2 = c->rank[COMM_EDP];
    const float *own2 = own + R->own_len;
    if (r2 != 0) {
      if (comm_send(c, COMM_EDP, COMM_F32, own2, R->own2_len, 0, 210 + s, e) < 0)
        fatal(R, "sending an expert ZeRO slice to the checkpoint writer", e);
    } else {
      if (!all && !(all = rt_alloc((size_t)R->pool_cap * sizeof(float)))) fatal(R, "out of memory gathering a checkpoint", NULL);
      memcpy(all + R->expert_lo, own2, (size_t)R->own2_len * sizeof(float));
      for (int q = 1; q < edp; q++)
        if (comm_recv(c, COMM_EDP, COMM_F32, all + R->expert_lo + (int64_t)q * R->own2_len, R->own2_len, q, 210 + s, e) < 0)
          fatal(R, "receiving an expert ZeRO slice for the checkpoint", e);
    }
  }
  rt_free(wide);
  *tmp = all;
  return all;
}

typedef struct {
  const Run *R;
  const TrainTensor *x;
} InitJob;

static void init_part(void *ctx, int64_t lo, int64_t hi) {
  const InitJob *j = ctx;
  const ArtParam *p = j->x->param;
  init_fill_f32_shard_part(j->x->data, p->rank, p->shape, &j->x->split, &p->init, (uint64_t)j->R->seed, p->name, j->x->layer,
                           lo, hi);
}

/* The rows of a padded vocabulary (ArtParam.logical_rows): the model's
 * tensor is the first rows, so checkpoints hold those, and a shard's rows
 * past them stay zero (no logit, no gradient: spmd.h). */
static int64_t logical_numel(const ArtParam *p) {
  int64_t n = artifact_param_numel(p);
  return p->logical_rows > 0 ? n / p->shape[0] * p->logical_rows : n;
}

static void zero_padded_rows(const ArtParam *p, const ShardSplit *sp, float *data) {
  if (p->logical_rows <= 0) return;
  int64_t parts = sp->axis == 0 ? sp->parts : 1, rows = p->shape[0] / parts;
  int64_t row = artifact_param_numel(p) / p->shape[0], first = (sp->axis == 0 ? sp->index : 0) * rows;
  int64_t keep = p->logical_rows - first;
  if (keep < 0) keep = 0;
  if (keep < rows) memset(data + keep * row, 0, sizeof(float) * (size_t)((rows - keep) * row));
}

/* The initial values on the rank's threads: the generator is counter-based
 * (core/init.h), so the values are the same bits for any thread count (and
 * a padded vocabulary's rows are the unpadded tensor's: a value's counter
 * is its index, and padding only appends rows). */
static void init_tensors(Run *R) {
  for (int i = 0; i < R->ctx.ntensors; i++) {
    TrainTensor *x = &R->ctx.tensors[i];
    const ArtParam *p = x->param;
    int64_t n = shard_numel(p->rank, p->shape, &x->split);
    InitJob job = {R, x};
    par_for(par_threads_for(R->o->nthreads, n), n, init_part, &job);
    zero_padded_rows(p, &x->split, x->data);
  }
}

/* ---- the program ---- */

static int load_program(Run *R, RtErr *e) {
  const Artifact *a = R->a;
  if (a->target && !strcmp(a->target, "cuda")) {
    R->prog = cuda_program();
    return 0;
  }
  if (R->o->device) return rt_fail(e, "--device %s: the artifact's target is %s; --device applies to --target cuda artifacts", R->o->device, a->target ? a->target : "cpu");
  if (!strcmp(a->program_kind, "builtin")) {
    R->prog = builtin_program(a->program_name);
    if (!R->prog) return rt_fail(e, "%s: program.name: no builtin program %s (there is: bigram)", a->manifest_path, a->program_name);
    return 0;
  }
  const char *path = a->ranks[R->me].program;
  R->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!R->dl) return rt_fail(e, "%s: cannot load the rank's program: %s", path, dlerror());
  void *sym = dlsym(R->dl, TRAIN_PROGRAM_SYMBOL);
  if (!sym) return rt_fail(e, "%s: not an hpdl program (no symbol %s)", path, TRAIN_PROGRAM_SYMBOL);
  const TrainProgram *(*entry)(void);
  memcpy(&entry, &sym, sizeof entry); /* object pointer to function pointer, as POSIX allows */
  R->prog = entry();
  if (!R->prog || R->prog->abi != TRAIN_PROGRAM_ABI)
    return rt_fail(e, "%s: program interface version %d, this hpdlrun speaks %d (recompile with the matching hpdlc)", path,
                   R->prog ? R->prog->abi : -1, TRAIN_PROGRAM_ABI);
  return 0;
}

/* ---- checkpoints ---- */

static json_t *ckpt_info_json(Run *R, int64_t step) {
  const Artifact *a = R->a;
  int64_t per_step = (int64_t)a->layout.dp * a->micro_batch * a->num_micro_batches;
  json_t *info = json_pack("{s:I, s:s?, s:s, s:s, s:I, s:{s:I, s:b}, s:i, s:{s:i, s:i, s:i, s:i, s:I, s:I}, s:I}", "step", (json_int_t)step,
                   "model", a->model, "program", a->program_kind, "optimizer", optim_kind_name(R->opt.kind), "seed",
                   (json_int_t)R->seed, "data", "sequences", (json_int_t)(R->data_start + (step - R->start_step) * per_step),
                   "shuffle", a->shuffle, "world_size", R->c->world_size, "layout", "dp", a->layout.dp, "tp", a->layout.tp, "pp",
                   a->layout.pp, "cp", a->layout.cp, "micro_batch", (json_int_t)a->micro_batch, "num_micro_batches",
                   (json_int_t)a->num_micro_batches, "updates", (json_int_t)R->updates);
  if (R->scaling)
    json_object_set_new(info, "loss_scale", json_pack("{s:f, s:I, s:I}", "scale", R->scale, "good_steps", (json_int_t)R->scale_good,
                                                      "skipped", (json_int_t)R->skipped));
  return info;
}

/* The world rank holding piece `piece` of copy `layer` of p: data-parallel
 * replica 0 of the copy's pipeline stage. */
static int owner_of(const Run *R, const ArtParam *p, int64_t layer, int piece) {
  CommCoords k = {0, 0, p->stages[layer], 0};
  int n2 = split_parts(R->c, p, 1);
  for (int second = 0; second < 2; second++) {
    if (split_parts(R->c, p, second) <= 1) continue;
    int at = second ? piece % n2 : piece / n2;
    CommGroup g = second ? p->split2_group : p->split_group;
    if (g == COMM_TP) k.tp = at;
    else if (g == COMM_EP) k = comm_ep_member(&R->c->layout, k, at); /* member at of the first expert group */
    else k.cp = at;
  }
  return comm_rank_of(&R->c->layout, k);
}

static TrainTensor *local_tensor(Run *R, const ArtParam *p, int64_t layer) {
  for (int i = 0; i < R->ctx.ntensors; i++)
    if (R->ctx.tensors[i].param == p && R->ctx.tensors[i].layer == layer) return &R->ctx.tensors[i];
  return NULL;
}

static void *save_main(void *arg) {
  SaveJob *j = arg;
  double t0 = rt_now();
  j->rc = ckpt_save(j->dir, j->step, j->t, j->n, j->info, j->keep, j->manifest, &j->err);
  j->seconds = rt_now() - t0;
  __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void free_job(SaveJob *j) {
  if (!j) return;
  for (int i = 0; i < j->n; i++) {
    rt_free((void *)(uintptr_t)j->t[i].name);
    rt_free((void *)(uintptr_t)j->t[i].data);
  }
  rt_free(j->t);
  rt_free(j->dir);
  json_decref(j->info);
  rt_free(j);
}

/* Waits for a background save; 0, or -1 with its message. */
static int join_save(Run *R, RtErr *e) {
  if (!R->thr_live) return 0;
  pthread_join(R->thr, NULL);
  R->thr_live = 0;
  SaveJob *j = R->job;
  R->job = NULL;
  int rc = j->rc;
  if (rc < 0) rt_fail(e, "the checkpoint of step %" PRId64 ", written in the background: %s", j->step, j->err.msg);
  else {
    snprintf(R->last_ckpt, sizeof R->last_ckpt, "%s", j->manifest);
    if (R->out) fprintf(R->out, "%scheckpoint %s (%.2f s, in the background)\n", R->tty ? "\r\033[K" : "", j->manifest, j->seconds);
  }
  free_job(j);
  return rc;
}

/* After a step went non-finite: the first gradient, in the manifest's order
 * (parameter, then layer), holding a value that is not finite, agreed over
 * the ranks (each counts its owned part of the tensors it represents, as
 * the norm does), with how many such values it has in all. Writes the
 * tensor's name into name; 0 when every gradient is finite. */
static int64_t first_bad_gradient(Run *R, char *name, size_t n) {
  double key = -INFINITY; /* the smallest key found, negated (the reduction is a max) */
  for (int i = 0; i < R->ctx.ntensors; i++) {
    int64_t lo, hi;
    if (!R->norm_rep[i] || !(R->zero > 0 || dp_first(R->c, &R->ctx.tensors[i])) || !owned_part(R, i, &lo, &hi)) continue;
    const float *g = grad_at(R, lo);
    int64_t j = 0;
    while (j < hi - lo && isfinite(g[j])) j++;
    if (j == hi - lo) continue;
    const TrainTensor *x = &R->ctx.tensors[i];
    double k = (double)(x->param - R->a->params) * 1048576.0 + (double)x->layer;
    if (-k > key) key = -k;
  }
  RtErr e;
  if (comm_all_reduce(R->c, COMM_WORLD, COMM_F64, COMM_MAX, &key, 1, &e) < 0) fatal(R, "agreeing on the first bad gradient", &e);
  if (key == -INFINITY) return 0;
  int64_t want = (int64_t)-key, pidx = want / 1048576, layer = want % 1048576;
  double count = 0;
  for (int i = 0; i < R->ctx.ntensors; i++) {
    int64_t lo, hi;
    const TrainTensor *x = &R->ctx.tensors[i];
    if (x->param - R->a->params != pidx || x->layer != layer) continue;
    if (!R->norm_rep[i] || !(R->zero > 0 || dp_first(R->c, &R->ctx.tensors[i])) || !owned_part(R, i, &lo, &hi)) continue;
    const float *g = grad_at(R, lo);
    for (int64_t j = 0; j < hi - lo; j++) count += !isfinite(g[j]);
  }
  if (comm_all_reduce(R->c, COMM_WORLD, COMM_F64, COMM_SUM, &count, 1, &e) < 0) fatal(R, "counting the bad gradient's values", &e);
  if (artifact_param_name(&R->a->params[pidx], layer, name, n) < 0) snprintf(name, n, "?");
  return (int64_t)count;
}

/* Gathers every logical tensor on rank 0 and writes the checkpoint there. */
static int save_checkpoint(Run *R, int64_t step, RtErr *e) {
  const Artifact *a = R->a;
  Comm *c = R->c;
  int me = R->me, failed = 0;
  /* A previous background save must finish first (and its error counts). */
  if (me == 0 && join_save(R, e) < 0) failed = 1;
  if (agree(R, failed) >= 0) return -1;
  int nstate = R->opt.kind == OPTIM_ADAMW ? 2 : R->opt.momentum != 0 ? 1 : 0;
  int nlogical = 0;
  for (int i = 0; i < a->nparams; i++) nlogical += (int)a->params[i].count;
  SaveJob *job = NULL;
  if (me == 0) {
    job = rt_calloc(1, sizeof *job);
    if (job) job->t = rt_calloc((size_t)(nlogical * (1 + nstate) + 1), sizeof *job->t);
    if (!job || !job->t) fatal(R, "out of memory gathering a checkpoint", NULL);
  }
  /* Sharded state (ZeRO) is gathered whole on each dp group's member 0. */
  const float *whole[3] = {NULL, NULL, NULL};
  float *whole_tmp[3] = {NULL, NULL, NULL};
  for (int s = 0; s <= nstate; s++) whole[s] = whole_state(R, s, &whole_tmp[s], e);
  float *piece = NULL;
  int64_t piece_cap = 0;
  int k = 0;
  for (int i = 0; i < a->nparams; i++) {
    const ArtParam *p = &a->params[i];
    int64_t numel = artifact_param_numel(p);
    for (int64_t l = 0; l < p->count; l++) {
      int parts = split_parts(c, p, 0) * split_parts(c, p, 1);
      float *logical[3] = {NULL, NULL, NULL};
      if (me == 0)
        for (int s = 0; s <= nstate; s++)
          if (!(logical[s] = rt_alloc((size_t)numel * sizeof(float)))) fatal(R, "out of memory gathering a checkpoint", NULL);
      TrainTensor *mine = local_tensor(R, p, l);
      for (int q = 0; q < parts; q++) {
        int owner = owner_of(R, p, l, q);
        if (owner != me && me != 0) continue;
        ShardSplit sp = piece_split(c, p, q);
        int64_t ln = shard_numel(p->rank, p->shape, &sp);
        for (int s = 0; s <= nstate; s++) {
          if (owner == me) {
            const float *src = whole[s] + R->offset[mine - R->ctx.tensors];
            if (me == 0) shard_insert(logical[s], 4, p->rank, p->shape, &sp, src);
            else if (comm_send(c, COMM_WORLD, COMM_F32, src, ln, 0, 100 + s, e) < 0) fatal(R, "sending a checkpoint shard", e);
          } else { /* rank 0 receives */
            if (ln > piece_cap) {
              rt_free(piece);
              piece_cap = ln;
              if (!(piece = rt_alloc((size_t)ln * sizeof(float)))) fatal(R, "out of memory gathering a checkpoint", NULL);
            }
            if (comm_recv(c, COMM_WORLD, COMM_F32, piece, ln, owner, 100 + s, e) < 0) fatal(R, "receiving a checkpoint shard", e);
            shard_insert(logical[s], 4, p->rank, p->shape, &sp, piece);
          }
        }
      }
      if (me == 0) {
        char name[256];
        artifact_param_name(p, l, name, sizeof name);
        static const char *const prefix[3] = {"", "opt.m.", "opt.v."};
        for (int s = 0; s <= nstate; s++) {
          char full[300];
          snprintf(full, sizeof full, "%s%s", (s == 1 && R->opt.kind == OPTIM_SGD) ? "opt.momentum." : prefix[s], name);
          CkptTensor *t = &job->t[k++];
          t->name = rt_strdup(full);
          t->dtype = CKPT_F32;
          t->rank = p->rank;
          memcpy(t->shape, p->shape, sizeof t->shape);
          if (p->logical_rows > 0) t->shape[0] = p->logical_rows; /* the model's rows come first */
          t->data = logical[s];
          if (!t->name) fatal(R, "out of memory", NULL);
        }
      }
    }
  }
  rt_free(piece);
  for (int s = 0; s < 3; s++) rt_free(whole_tmp[s]);
  failed = 0;
  if (me == 0) {
    job->n = k;
    job->dir = rt_strdup(R->ckpt_dir);
    job->step = step;
    job->keep = (int)R->keep;
    job->info = ckpt_info_json(R, step);
    if (R->async) {
      R->job = job;
      if (pthread_create(&R->thr, NULL, save_main, job) == 0) {
        R->thr_live = 1;
        job = NULL;
      } else {
        R->job = NULL;
        save_main(job); /* no thread: write now */
      }
    } else {
      save_main(job);
    }
    if (job) {
      if (job->rc < 0) {
        rt_fail(e, "%s", job->err.msg);
        failed = 1;
      } else {
        snprintf(R->last_ckpt, sizeof R->last_ckpt, "%s", job->manifest);
        if (R->out) fprintf(R->out, "%scheckpoint %s (%.2f s)\n", R->tty ? "\r\033[K" : "", job->manifest, job->seconds);
      }
      free_job(job);
    }
  }
  /* A failed write stops the run on every rank: training on without the
   * checkpoints asked for would lose work silently. */
  return agree(R, failed) >= 0 ? -1 : 0;
}

/* Rank 0 opens and checks the checkpoint; then every logical tensor is
 * broadcast and each rank keeps its shard. */
static int resume(Run *R, RtErr *e, int *resumed) {
  const Artifact *a = R->a;
  Comm *c = R->c;
  int me = R->me, failed = 0;
  Ckpt *ck = NULL;
  CkptFile *init = NULL; /* --init-from: a tensor file, weights only */
  const CkptFile *cf = NULL;
  const char *cpath = NULL;
  /* header: have, step, sequences, seed, has_m, has_v (doubles: exact below 2^53) */
  double hdr[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  *resumed = 0;
  if (me == 0 && R->o->init_from) {
    init = ckpt_st_open(R->o->init_from, e);
    if (!init) failed = 1;
    cf = init;
    cpath = R->o->init_from;
  } else if (me == 0) {
    const char *from = R->o->resume_from ? R->o->resume_from : R->ckpt_dir;
    int have = 1;
    if (!R->o->resume_from) {
      int64_t s;
      char mp[4096];
      int r = from ? ckpt_latest(from, &s, mp, e) : 0;
      if (r < 0) failed = 1;
      have = r > 0;
      if (!from) failed = rt_fail(e, "--resume needs a checkpoint folder (--checkpoint-dir, or the train block's checkpoint.dir)") < 0;
      if (!failed && !have && R->out) fprintf(R->out, "hpdlrun: no checkpoint in %s yet: starting from step 0\n", from);
    }
    if (!failed && have) {
      ck = ckpt_load(from, e);
      if (!ck) failed = 1;
      else cf = ckpt_file(ck), cpath = ckpt_path(ck);
    }
  }
  if (me == 0) {
    /* Check every parameter before anyone waits on a broadcast. */
    int has_m = 1, has_v = 1;
    for (int i = 0; cf && !failed && i < a->nparams; i++) {
      const ArtParam *p = &a->params[i];
      for (int64_t l = 0; l < p->count && !failed; l++) {
        char name[256], full[300];
        artifact_param_name(p, l, name, sizeof name);
        const CkptTensor *t = ckpt_st_find(cf, name);
        if (!t) {
          failed = rt_fail(e, "%s: no tensor %s, a parameter of this artifact (%s)", cpath, name,
                           init ? "the file must hold every parameter under the names hpdlc compile gives them: the manifest's params"
                                : "a checkpoint of another model?") < 0;
          break;
        }
        int same = t->rank == p->rank;
        for (int d = 0; same && d < p->rank; d++) same = t->shape[d] == (d == 0 && p->logical_rows > 0 ? p->logical_rows : p->shape[d]);
        if (!same || (t->dtype != CKPT_F32 && t->dtype != CKPT_F64 && t->dtype != CKPT_F16 && t->dtype != CKPT_BF16)) {
          char got[160] = "", want[160] = "";
          for (int d = 0; d < t->rank; d++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%" PRId64, d ? ", " : "", t->shape[d]);
          for (int d = 0; d < p->rank; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%" PRId64, d ? ", " : "",
                     d == 0 && p->logical_rows > 0 ? p->logical_rows : p->shape[d]);
          failed = rt_fail(e, "%s: tensor %s is %s[%s], the artifact's parameter is f32[%s]", cpath, name, ckpt_dtype_name(t->dtype),
                           got, want) < 0;
          break;
        }
        snprintf(full, sizeof full, "%s%s", R->opt.kind == OPTIM_SGD ? "opt.momentum." : "opt.m.", name);
        if (!ckpt_st_find(cf, full)) has_m = 0;
        snprintf(full, sizeof full, "opt.v.%s", name);
        if (!ckpt_st_find(cf, full)) has_v = 0;
      }
    }
    if (init && !failed) { /* weights only: step 0, this run's seed and data, fresh optimizer state */
      hdr[0] = 1;
      hdr[3] = (double)R->seed;
      if (R->out) fprintf(R->out, "hpdlrun: the parameters start from %s\n", cpath);
    }
    if (ck && !failed) {
      const json_t *info = ckpt_info(ck);
      json_t *jd = json_object_get(json_object_get(info, "data"), "sequences"), *js = json_object_get(info, "seed");
      hdr[0] = 1;
      hdr[1] = (double)ckpt_step(ck);
      hdr[2] = json_is_integer(jd) ? (double)json_integer_value(jd) : 0;
      hdr[3] = json_is_integer(js) ? (double)json_integer_value(js) : (double)R->seed;
      hdr[4] = has_m;
      hdr[5] = has_v;
      /* updates applied (a checkpoint without it: one a step); fp16's scale */
      json_t *ju = json_object_get(info, "updates"), *jl = json_object_get(info, "loss_scale");
      hdr[6] = json_is_integer(ju) && json_integer_value(ju) >= 0 && json_integer_value(ju) <= ckpt_step(ck) ? (double)json_integer_value(ju)
                                                                                                              : hdr[1];
      json_t *jsc = json_object_get(jl, "scale"), *jg = json_object_get(jl, "good_steps"), *jk = json_object_get(jl, "skipped");
      if (json_is_number(jsc) && json_number_value(jsc) >= LOSS_SCALE_MIN && json_number_value(jsc) <= 18446744073709551616.0 &&
          json_is_integer(jg) && json_integer_value(jg) >= 0 && json_is_integer(jk) && json_integer_value(jk) >= 0) {
        hdr[7] = json_number_value(jsc);
        hdr[8] = (double)json_integer_value(jg);
        hdr[9] = (double)json_integer_value(jk);
      }
      if (R->out) {
        fprintf(R->out, "hpdlrun: resuming from %s (step %" PRId64 ")\n", ckpt_path(ck), ckpt_step(ck));
        if ((has_state(R, 1) && !has_m) || (has_state(R, 2) && !has_v))
          fprintf(R->out, "hpdlrun: note: the checkpoint has no %s state for this optimizer: it starts from zero\n",
                  optim_kind_name(R->opt.kind));
      }
    }
  }
  if (agree(R, failed) >= 0) {
    ckpt_close(ck);
    ckpt_st_close(init);
    return -1;
  }
  if (comm_broadcast(c, COMM_WORLD, COMM_F64, hdr, 10, 0, e) < 0) fatal(R, "broadcasting the checkpoint header", e);
  if (hdr[0] == 0) return 0;
  float *buf = NULL, *shard = NULL;
  int64_t cap = 0;
  for (int i = 0; i < a->nparams; i++) {
    const ArtParam *p = &a->params[i];
    int64_t numel = artifact_param_numel(p);
    if (numel > cap) {
      rt_free(buf);
      rt_free(shard);
      cap = numel;
      buf = rt_alloc((size_t)numel * sizeof(float));
      shard = rt_alloc((size_t)numel * sizeof(float));
      if (!buf || !shard) fatal(R, "out of memory loading a checkpoint", NULL);
    }
    for (int64_t l = 0; l < p->count; l++) {
      TrainTensor *mine = local_tensor(R, p, l);
      for (int s = 0; s < 3; s++) {
        /* parameters into the whole pool (zero 3 keeps its slice below);
         * sharded moments: the owned part of this rank's shard */
        float *dst = !mine ? NULL : s == 0 ? mine->data : R->zero == 0 && !R->pool16[0] ? (s == 1 ? mine->m : mine->v) : shard;
        if (s == 1 && !hdr[4]) continue;
        if (s == 2 && !hdr[5]) continue;
        if (s > 0 && !has_state(R, s)) continue;
        if (me == 0) {
          char name[256], full[300];
          artifact_param_name(p, l, name, sizeof name);
          snprintf(full, sizeof full, "%s%s", s == 0 ? "" : s == 2 ? "opt.v." : R->opt.kind == OPTIM_SGD ? "opt.momentum." : "opt.m.", name);
          const CkptTensor *t = ckpt_st_find(cf, full);
          RtErr le;
          if (!t || ckpt_numel(t) != logical_numel(p) || ckpt_st_read_f32(t, buf, &le) < 0)
            fatal(R, "reading a checkpoint tensor that was checked a moment ago", NULL);
          memset(buf + logical_numel(p), 0, sizeof(float) * (size_t)(numel - logical_numel(p))); /* padded rows */
        }
        if (comm_broadcast(c, COMM_WORLD, COMM_F32, buf, numel, 0, e) < 0) fatal(R, "broadcasting a checkpoint tensor", e);
        if (dst) shard_extract(buf, 4, p->rank, p->shape, &mine->split, dst);
        int64_t lo, hi, ti = mine ? mine - R->ctx.tensors : 0;
        if (dst == shard && owned_part(R, (int)ti, &lo, &hi)) {
          const float *from = shard + (lo - R->offset[ti]);
          if (R->pool16[s - 1]) /* bf16 moments: rounded as the update stores them (exact for a bf16 run's checkpoint) */
            for (int64_t j = 0; j < hi - lo; j++) R->pool16[s - 1][state_index(R, lo) + j] = half_bf16_from_f32(from[j]);
          else memcpy(R->pool[1 + s] + state_index(R, lo), from, (size_t)(hi - lo) * sizeof(float));
        }
      }
    }
  }
  rt_free(buf);
  rt_free(shard);
  ckpt_close(ck);
  ckpt_st_close(init);
  R->start_step = (int64_t)hdr[1];
  R->data_start = (int64_t)hdr[2];
  R->updates = (int64_t)hdr[6];
  /* a dynamic scale goes on from the checkpoint's (a static one is the
   * artifact's); a checkpoint of an fp32 or bf16 run starts it afresh */
  if (R->scaling && R->scale_dynamic && hdr[7] > 0) {
    R->scale = hdr[7];
    R->scale_good = (int64_t)hdr[8];
  }
  if (hdr[7] > 0) R->skipped = (int64_t)hdr[9];
  if ((int64_t)hdr[3] != R->seed) {
    if (me == 0 && R->out)
      fprintf(R->out, "hpdlrun: note: the data order keeps the checkpoint's seed %" PRId64 " (not %" PRId64 ")\n", (int64_t)hdr[3],
              R->seed);
    R->seed = (int64_t)hdr[3];
  }
  *resumed = 1;
  return 0;
}

/* ---- output ---- */

static void human(char *buf, size_t n, double v) {
  if (v >= 1e9) snprintf(buf, n, "%.2fG", v / 1e9);
  else if (v >= 1e6) snprintf(buf, n, "%.2fM", v / 1e6);
  else if (v >= 1e3) snprintf(buf, n, "%.1fk", v / 1e3);
  else snprintf(buf, n, "%.0f", v);
}

static void bytes_str(char *buf, size_t n, double v) {
  if (v >= 1e9) snprintf(buf, n, "%.3f GB", v / 1e9);
  else if (v >= 1e6) snprintf(buf, n, "%.3f MB", v / 1e6);
  else if (v >= 1e3) snprintf(buf, n, "%.3f kB", v / 1e3);
  else snprintf(buf, n, "%.0f B", v);
}

static void clock_str(char *buf, size_t n, double s) {
  if (!(s >= 0) || s > 1e8) {
    snprintf(buf, n, "?");
    return;
  }
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void json_num(FILE *f, const char *key, double v, int last) {
  if (isfinite(v)) fprintf(f, "\"%s\": %.9g%s", key, v, last ? "" : ", ");
  else fprintf(f, "\"%s\": null%s", key, last ? "" : ", "); /* JSON has no NaN */
}

/* The start-up line on the optimizer state each rank holds (when dp > 1 or
 * zero > 0): the largest rank's (pipeline stages and tensor shards differ),
 * and at zero > 0 the whole state it is a slice of. */
static void report_state(Run *R) {
  double bytes = (has_state(R, 1) + has_state(R, 2)) * (R->opt.moments16 ? 2.0 : 4.0);
  double b[2] = {bytes * (double)(R->own_len + R->own2_len), bytes * (double)R->pool_len};
  RtErr e;
  if (comm_all_reduce(R->c, COMM_WORLD, COMM_F64, COMM_MAX, b, 2, &e) < 0) fatal(R, "reducing the state sizes", &e);
  int dp = R->a->layout.dp;
  if (!R->out || (dp == 1 && R->zero == 0)) return; /* one replica, nothing sharded: nothing to say */
  char own[32], all[32];
  bytes_str(own, sizeof own, b[0]);
  bytes_str(all, sizeof all, b[1]);
  char comp[96] = "";
  if (dp > 1 && R->a->compression != COMM_COMPRESS_NONE)
    snprintf(comp, sizeof comp, "; gradients compressed (%s) in the %s", comm_compress_name(R->a->compression),
             R->zero >= 2 ? "reduce-scatter" : "all-reduce");
  if (R->opt.moments16) snprintf(comp + strlen(comp), sizeof comp - strlen(comp), "; moments in bf16");
  if (R->zero == 0)
    fprintf(R->out, "hpdlrun: optimizer state %s per rank (zero 0: whole on each of the %d data-parallel ranks)%s\n", own, dp, comp);
  else
    fprintf(R->out, "hpdlrun: optimizer state %s per rank (zero %d, 1/%d of %s)%s%s\n", own, R->zero, dp, all,
            R->zero == 1   ? ""
            : R->zero == 2 ? "; reduced gradients sharded too"
                           : "; reduced gradients and parameters sharded too, parameters gathered once per step",
            comp);
  fflush(R->out);
}

/* ---- the run ---- */

/* hpdlrun --profile: the program's spans (TrainProfiler) */
static double profiler_now(void *self) { return prof_time(self); }

static void profiler_span(void *self, const char *name, const char *cat, double t0, double t1, int mb, int chunk, int64_t layer,
                          int64_t bytes, double flops) {
  ProfArgs a = PROF_ARGS_NONE;
  a.cat = cat;
  a.mb = mb;
  a.chunk = chunk;
  a.layer = layer;
  a.bytes = bytes;
  a.flops = flops;
  prof_span(self, PROF_PROGRAM, name, t0, t1, &a);
}

static int setup(Run *R, RtErr *e) {
  const Artifact *a = R->a;
  if (a->nranks != R->c->world_size)
    return rt_fail(e, "%s: the artifact is for %d ranks, this job has %d", a->manifest_path, a->world_size, R->c->world_size);
  if (load_program(R, e) < 0) return -1;
  if (make_tensors(R, e) < 0) return -1;
  init_tensors(R);
  R->ctx.arena_bytes = a->ranks[R->me].arena_bytes;
  R->ctx.arena = rt_alloc_aligned((size_t)(R->ctx.arena_bytes ? R->ctx.arena_bytes : 64));
  if (!R->ctx.arena) return rt_fail(e, "out of memory for the arena (%" PRId64 " bytes)", R->ctx.arena_bytes);
  par_prefault(R->o->nthreads, R->ctx.arena, (size_t)R->ctx.arena_bytes);
  R->ctx.art = a;
  R->ctx.comm = R->c;
  R->ctx.device = R->o->device;
  R->ctx.nthreads = R->o->nthreads;
  if (R->o->profile) {
    if (!(R->prof = prof_new(R->o->profile_cap))) return rt_fail(e, "out of memory for the profile");
    R->profiler.self = R->prof;
    R->profiler.now = profiler_now;
    R->profiler.span = profiler_span;
    R->ctx.prof = &R->profiler;
  }
  R->ctx.grad_scale = 1.0 / ((double)a->layout.dp * (double)a->num_micro_batches);
  R->scaling = a->precision && !strcmp(a->precision, "fp16");
  R->scale_dynamic = R->scaling && a->loss_scale == 0;
  R->scale = !R->scaling ? 1.0 : a->loss_scale > 0 ? a->loss_scale : LOSS_SCALE_INIT;
  /* tests: growth within a short run; a dynamic scale that starts low */
  int64_t window = rt_fault("loss-scale-window"), init = rt_fault("loss-scale-init");
  R->scale_window = window > 0 ? window : LOSS_SCALE_WINDOW;
  if (R->scale_dynamic && init >= 1 && init <= ((int64_t)1 << 62)) R->scale = (double)init;
  R->ctx.half = rt_calloc((size_t)R->ctx.ntensors + 1, sizeof *R->ctx.half);
  R->ctx.half_step = rt_calloc((size_t)R->ctx.ntensors + 1, sizeof *R->ctx.half_step);
  if (!R->ctx.half || !R->ctx.half_step) return rt_fail(e, "out of memory");
  for (int i = 0; i < R->ctx.ntensors; i++) R->ctx.half_step[i] = -1;
  R->self = R->prog->create(&R->ctx, e);
  if (!R->self) return -1;
  /* dp > 1 at zero 0 without compression too: the program then all-reduces
   * the gradients over dp itself */
  R->count = rt_calloc((size_t)R->ctx.ntensors + 1, 1);
  if (!R->count) return rt_fail(e, "out of memory");
  /* at zero 0 every dp member holds every value: member 0 counts them;
   * under ZeRO each member counts the part it owns (the program's shards) */
  for (int i = 0; i < R->ctx.ntensors; i++)
    R->count[i] = R->norm_rep[i] && (R->zero > 0 || dp_first(R->c, &R->ctx.tensors[i])) && !R->ctx.tensors[i].param->state;
  if (R->zero > 0) {
    R->shards = (TrainShards){R->zero,   R->offset,   R->pool_cap, R->own_lo,  R->own_len, R->expert_lo,
                              R->own2_lo, R->own2_len, R->pool[2],  R->pool[3], R->master};
    R->ctx.shards = &R->shards;
  }
  /* compressed to 16 bits, a program may sum on its device as comm.c does (program.h) */
  R->resident = (a->layout.dp == 1 || a->compression == COMM_COMPRESS_NONE || comm_compress_is16(a->compression)) &&
                R->prog->resident && R->prog->grad_sumsq && R->prog->update &&
                R->prog->state && R->prog->resident(R->self, &R->ctx);
  /* bf16 moments on a device are the device optimizer's; the host's pools there are fp32 */
  if (R->opt.moments16 && !R->pool16[0] && R->pool[2] && !R->resident)
    return rt_fail(e, "train.moments = bf16: the CUDA target keeps 16-bit moments in its device optimizer, and the update stays "
                      "on the host here (int8 or top-k gradient compression, HPDL_HOST_OPTIMIZER=1, or the reason printed "
                      "above): compile with moments = fp32 for this run");
  if (R->me == 0 && R->metrics == NULL && R->o->metrics) {
    R->metrics = fopen(R->o->metrics, (R->o->resume || R->o->resume_from) ? "a" : "w");
    if (!R->metrics) return rt_fail_errno(e, errno, "%s: cannot open the metrics file", R->o->metrics);
  }
  return 0;
}

/* A loader of the artifact's kind (token windows or images) over pattern,
 * from stream position start. */
static DataLoader *open_loader(Run *R, const char *pattern, int shuffle, int64_t start, RtErr *e) {
  const Artifact *a = R->a;
  DataConfig dc;
  memset(&dc, 0, sizeof dc);
  dc.pattern = pattern;
  dc.batch = a->micro_batch;
  dc.seq_len = a->seq_len;
  dc.rank = R->c->coords.dp;
  dc.nranks = a->layout.dp;
  dc.seed = (uint64_t)R->seed;
  dc.shuffle = shuffle;
  dc.prefetch = 1;
  dc.vocab = a->vocab;
  dc.start = start;
  if (a->image_rank <= 0) return data_loader_open(&dc, e);
  /* an image model: images and labels from image files */
  DataImageSpec is;
  memset(&is, 0, sizeof is);
  is.rank = a->image_rank < DATA_IMAGE_MAX_RANK ? a->image_rank : DATA_IMAGE_MAX_RANK;
  memcpy(is.dims, a->image_dims, sizeof(int64_t) * (size_t)is.rank);
  is.classes = a->classes;
  is.input = a->image_input;
  return data_loader_open_images(&dc, &is, e);
}

/* The step's micro-batches from loader L into R->mbuf. */
static int next_micro(Run *R, DataLoader *L, RtErr *e) {
  for (int k = 0; k < R->nmicro; k++) {
    const DataBatch *b = data_loader_next(L, e);
    if (!b) return -1;
    if (b->images) {
      memcpy(R->mbuf[k].images, b->images, (size_t)(b->batch * b->image_elems) * sizeof(float));
      memcpy(R->mbuf[k].labels, b->labels, (size_t)b->batch * sizeof(int32_t));
    } else {
      int64_t bt = b->batch * b->seq_len;
      memcpy(R->mbuf[k].inputs, b->inputs, (size_t)bt * sizeof(int32_t));
      memcpy(R->mbuf[k].targets, b->targets, (size_t)bt * sizeof(int32_t));
    }
    R->mbuf[k].batch = b->batch;
    R->mbuf[k].seq_len = b->seq_len;
    R->mbuf[k].image_elems = b->image_elems;
    R->mbuf[k].index = b->index;
    R->mbuf[k].epoch = b->epoch;
  }
  return 0;
}

/* --eval-every: the validation data (--eval-data, else the training
 * pattern's _train_ read as _val_, hpdl-data's naming), in file order. */
static int open_eval(Run *R, RtErr *e) {
  const char *train = R->o->data ? R->o->data : R->a->data;
  char derived[4096];
  const char *pattern = R->o->eval_data;
  if (!pattern) {
    const char *at = train ? strstr(train, "_train_") : NULL;
    if (!at || strlen(train) + 2 >= sizeof derived)
      return rt_fail(e, "--eval-every needs validation data: the training data %s has no _train_ to read as _val_; give --eval-data GLOB",
                     train ? train : "(none)");
    snprintf(derived, sizeof derived, "%.*s_val_%s", (int)(at - train), train, at + 7);
    pattern = derived;
  }
  R->eval_loader = open_loader(R, pattern, 0, 0, e);
  if (!R->eval_loader) return rt_fail(e, "the validation data (--eval-every): %s", e->msg);
  return 0;
}

/* The validation loss: eval_steps steps of the validation data from its
 * start, the model in evaluation mode (TrainCtx.eval: running statistics,
 * no dropout, no gradient kept: the seed is 0, and the next training step
 * zeroes the gradient pool before it runs), the mean over the steps of each
 * step's mean loss over the ranks that have it. Parameters and state are left as they
 * were; at zero 3 gathered for the pass and handed back after. */
static int evaluate(Run *R, int64_t s, double *val, RtErr *e) {
  data_loader_seek(R->eval_loader, 0);
  int64_t steps = R->o->eval_steps > 0 ? R->o->eval_steps : 10;
  double sum = 0, gs = R->ctx.grad_scale;
  if (R->master && !R->resident && gather_params(R, e) < 0) return -1;
  R->ctx.eval = 1;
  R->ctx.grad_scale = 0;
  R->ctx.step = s;
  int rc = 0;
  for (int64_t k = 0; k < steps && rc == 0; k++) {
    double loss = 0, red[2];
    int has = 0;
    if (next_micro(R, R->eval_loader, e) < 0) {
      rt_fail(e, "reading the validation data: %s", e->msg);
      rc = -1;
      break;
    }
    if (R->prog->step(R->self, &R->ctx, R->mptr, R->nmicro, &loss, &has, e) < 0) {
      rc = -1;
      break;
    }
    red[0] = has ? loss : 0;
    red[1] = has;
    if (comm_all_reduce(R->c, COMM_WORLD, COMM_F64, COMM_SUM, red, 2, e) < 0) rc = -1;
    else sum += red[1] > 0 ? red[0] / red[1] : 0;
  }
  R->ctx.eval = 0;
  R->ctx.grad_scale = gs;
  if (R->master) rt_release_pages(R->pool[0], (size_t)R->pool_cap * sizeof(float));
  *val = sum / (double)steps;
  return rc;
}

static int open_data(Run *R, RtErr *e) {
  const Artifact *a = R->a;
  R->loader = open_loader(R, R->o->data ? R->o->data : a->data, a->shuffle, R->data_start, e);
  if (!R->loader) return -1;
  if (R->o->eval_every > 0 && open_eval(R, e) < 0) return -1;
  R->nmicro = (int)a->num_micro_batches;
  R->mbuf = rt_calloc((size_t)R->nmicro, sizeof *R->mbuf);
  R->mptr = rt_calloc((size_t)R->nmicro, sizeof *R->mptr);
  if (!R->mbuf || !R->mptr) return rt_fail(e, "out of memory");
  int64_t elems = 1;
  for (int i = 0; i < a->image_rank; i++) elems *= a->image_dims[i]; /* at most 2^40 (artifact.c) */
  int64_t bt = a->micro_batch * a->seq_len, bi = a->micro_batch * elems;
  for (int k = 0; k < R->nmicro; k++) {
    DataBatch *b = &R->mbuf[k];
    if (a->image_rank > 0) {
      b->images = rt_calloc((size_t)bi, sizeof(float));
      b->labels = rt_calloc((size_t)a->micro_batch, sizeof(int32_t));
      if (!b->images || !b->labels) return rt_fail(e, "out of memory for the image batches");
    } else {
      b->inputs = rt_calloc((size_t)bt, sizeof(int32_t));
      b->targets = rt_calloc((size_t)bt, sizeof(int32_t));
      if (!b->inputs || !b->targets) return rt_fail(e, "out of memory");
    }
    R->mptr[k] = b;
  }
  return 0;
}

/* ---- hpdlrun --profile ---- */

/* A phase of the step on the "step" track, from *t to now; *t becomes now. */
static void phase(Run *R, const char *name, double *t) {
  double now = prof_time(R->prof);
  ProfArgs a = PROF_ARGS_NONE;
  a.cat = "phase";
  prof_span(R->prof, PROF_STEP, name, *t, now, &a);
  *t = now;
}

/* Fails now, not after the run, when rank 0 cannot write FILE: a file made
 * beside it (where the atomic write puts its temporary) and removed. */
static int profile_writable(const char *path, RtErr *e) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return rt_fail(e, "--profile %s: a folder, not a file", path);
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.check-%ld", path, (long)getpid()) >= (int)sizeof tmp) return rt_fail(e, "--profile %s: path too long", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return rt_fail_errno(e, errno, "--profile %s: the profile cannot be written there", path);
  close(fd);
  unlink(tmp);
  return 0;
}

/* Every rank's timeline to rank 0 over the communicator (sizes gathered,
 * then one message a rank), which writes the trace atomically and prints
 * the table. Every rank calls it; the status is rank 0's write. */
static int profile_finish(Run *R, RtErr *e) {
  Comm *c = R->c;
  int n = c->world_size, rc = 0;
  prof_enable(R->prof, 0);
  comm_profile(c, NULL);
  ProfRankInfo who = {c->world_rank, c->coords.dp, c->coords.tp, c->coords.pp, c->coords.cp, prof_peak_rss()};
  size_t len = 0;
  void *blk = prof_pack(R->prof, &who, &len);
  double mine = blk ? (double)len : -1, *lens = rt_calloc((size_t)n, sizeof *lens);
  ProfRank **ranks = rt_calloc((size_t)n, sizeof *ranks);
  if (!lens || !ranks) fatal(R, "out of memory for the profile", NULL);
  if (comm_all_gather(c, COMM_WORLD, COMM_F64, &mine, 1, lens, e) < 0) fatal(R, "gathering the profile's sizes", e);
  for (int r = 0; r < n; r++)
    if (lens[r] < 0) {
      rc = rt_fail(e, "--profile: rank %d ran out of memory packing its events", r);
      goto out;
    }
  if (R->me != 0) {
    if (comm_send(c, COMM_WORLD, COMM_U8, blk, (int64_t)len, 0, 30001, e) < 0) fatal(R, "sending the profile to rank 0", e);
    goto out;
  }
  char why[256];
  for (int r = 0; r < n && rc == 0; r++) {
    void *b = blk;
    if (r > 0) {
      b = rt_alloc((size_t)lens[r] + 1);
      if (!b) fatal(R, "out of memory for the profile", NULL);
      if (comm_recv(c, COMM_WORLD, COMM_U8, b, (int64_t)lens[r], r, 30001, e) < 0) fatal(R, "receiving the profiles", e);
    }
    ranks[r] = prof_unpack(b, r > 0 ? (size_t)lens[r] : len, why, sizeof why);
    if (b != blk) rt_free(b);
    if (!ranks[r]) rc = rt_fail(e, "--profile: rank %d's events: %s", r, why);
  }
  char *text = NULL;
  size_t tlen = 0;
  FILE *m = rc == 0 ? open_memstream(&text, &tlen) : NULL;
  if (rc == 0 && !m) rc = rt_fail_errno(e, errno, "--profile: no memory for the trace");
  if (m) {
    int bad = prof_trace_json(m, ranks, n) < 0;
    if (fclose(m) != 0 || bad) rc = rt_fail(e, "--profile: no memory for the trace");
    else if (rt_write_file_atomic(R->o->profile, text, tlen, e) < 0) rc = rt_err_prefix(e, "--profile");
    free(text);
  }
  if (rc == 0 && R->out) {
    fprintf(R->out, "hpdlrun: profile: %s (Chrome trace events: Perfetto, chrome://tracing)\n", R->o->profile);
    prof_table(R->out, ranks, n, 15);
    fflush(R->out);
  }
out:
  for (int r = 0; r < n && ranks; r++) prof_rank_free(ranks[r]);
  rt_free(ranks);
  rt_free(lens);
  free(blk);
  return rc;
}

static void teardown(Run *R) {
  RtErr e;
  if (R->me == 0 && join_save(R, &e) < 0) fprintf(stderr, "hpdlrun: error: %s\n", e.msg);
  if (R->self && R->prog) R->prog->destroy(R->self);
  if (R->dl) dlclose(R->dl);
  data_loader_close(R->loader);
  data_loader_close(R->eval_loader);
  for (int k = 0; R->mbuf && k < R->nmicro; k++) {
    rt_free(R->mbuf[k].inputs);
    rt_free(R->mbuf[k].targets);
    rt_free(R->mbuf[k].images);
    rt_free(R->mbuf[k].labels);
  }
  rt_free(R->mbuf);
  rt_free(R->mptr);
  for (int p = 0; p < 4; p++) rt_free_aligned(R->pool[p]);
  for (int k = 0; k < 2; k++) rt_free_aligned(R->pool16[k]);
  rt_free_aligned(R->grad_own);
  rt_free_aligned(R->master);
  rt_free(R->offset);
  rt_free(R->norm_rep);
  rt_free(R->count);
  rt_free_aligned(R->ctx.arena);
  rt_free(R->ctx.tensors);
  rt_free(R->ctx.half);
  rt_free(R->ctx.half_step);
  comm_compressor_free(&R->z);
  if (R->metrics) fclose(R->metrics);
  if (R->prof) comm_profile(R->c, NULL);
  prof_free(R->prof);
}

int train_run(const Artifact *a, Comm *comm, const TrainOptions *o, TrainSummary *sum, int *reporter, RtErr *e) {
  Run R;
  memset(&R, 0, sizeof R);
  memset(sum, 0, sizeof *sum);
  R.a = a;
  R.c = comm;
  R.o = o;
  R.me = comm->world_rank;
  R.out = R.me == 0 && o->progress != TRAIN_PROGRESS_QUIET ? o->out : NULL;
  R.tty = o->progress == TRAIN_PROGRESS_TTY || (o->progress == TRAIN_PROGRESS_AUTO && o->tty);
  R.opt = a->optim;
  /* ZeRO shards over the data-parallel ranks: over one there is nothing to
   * shard, and stage 0 is the same run without the stage's bookkeeping */
  R.zero = a->zero > 0 && a->layout.dp > 1 ? a->zero : 0;
  R.steps = o->steps >= 0 ? o->steps : a->steps;
  R.opt.total_steps = R.steps;
  R.seed = o->seed >= 0 ? o->seed : a->seed;
  R.log_every = o->log_every > 0 ? o->log_every : a->log_every;
  R.ckpt_dir = o->ckpt_dir ? o->ckpt_dir : a->ckpt_dir;
  R.ckpt_every = o->ckpt_every >= 0 ? o->ckpt_every : a->ckpt_every;
  R.keep = o->ckpt_keep >= 0 ? o->ckpt_keep : a->ckpt_keep;
  R.async = o->ckpt_async >= 0 ? o->ckpt_async : a->ckpt_async;
  /* The artifact's folder alone (every = 0) means never; a folder given on
   * the command line means at least the final state. */
  int save_final = R.ckpt_dir && (o->ckpt_dir || R.ckpt_every > 0);
  comm_compressor_init(&R.z, a->compression, a->topk_ratio, a->error_feedback);
  *reporter = 0;

  int failed = setup(&R, e) < 0;
  /* a checkpoint folder that cannot be made or written fails now, not at the
   * first save hours later (rank 0 writes the checkpoints) */
  if (!failed && R.me == 0 && R.ckpt_dir && (save_final || R.ckpt_every > 0)) {
    if (rt_mkdirs(R.ckpt_dir, e) < 0) failed = 1;
    else if (access(R.ckpt_dir, W_OK | X_OK) < 0) failed = rt_fail_errno(e, errno, "%s: the checkpoint folder cannot be written", R.ckpt_dir) < 0;
  }
  if (!failed && R.me == 0 && o->profile && profile_writable(o->profile, e) < 0) failed = 1;
  int who = agree(&R, failed);
  if (who < 0 && (o->resume || o->resume_from || o->init_from)) {
    int resumed;
    if (resume(&R, e, &resumed) < 0) who = 0; /* rank 0 did the checking */
  }
  if (who < 0) params_to_rest(&R);
  if (who < 0 && R.resident) {
    failed = R.prog->state(R.self, &R.ctx, 0, e) < 0;
    who = agree(&R, failed);
  }
  if (who < 0) {
    failed = open_data(&R, e) < 0;
    who = agree(&R, failed);
  }
  if (who >= 0) {
    *reporter = who == R.me;
    teardown(&R);
    return -1;
  }

  /* an image model counts images where a token model counts tokens (the
   * metrics' tokens_per_s then holds images per second too) */
  const int images = a->image_rank > 0;
  const int64_t tokens_per_step = (int64_t)a->layout.dp * a->micro_batch * a->num_micro_batches * (images ? 1 : a->seq_len);
  if (R.out) {
    char tok[32], what[96];
    human(tok, sizeof tok, (double)tokens_per_step);
    const DataImages *im = images ? data_loader_images(R.loader, 0) : NULL;
    if (im)
      snprintf(what, sizeof what, "%" PRId64 " images of %" PRId64 "x%" PRId64 "x%" PRId64 ", %" PRId64 " classes",
               data_loader_windows(R.loader), im->channels, im->height, im->width, im->classes);
    else
      snprintf(what, sizeof what, "%" PRId64 " windows of %" PRId64, data_loader_windows(R.loader), a->seq_len);
    /* the CPU target's bf16 GEMMs: oneDNN's, or why the operands are widened (gemm16.h) */
    char gemm16[200] = "";
    if (a->precision && !strcmp(a->precision, "bf16") && (!a->target || strcmp(a->target, "cuda")))
      snprintf(gemm16, sizeof gemm16, ", bf16 GEMMs by %s", gemm16_backend());
    char optimizer[40];
    snprintf(optimizer, sizeof optimizer, "%s%s", optim_kind_name(R.opt.kind), R.opt.moments16 ? " (bf16 moments)" : "");
    fprintf(R.out,
            "hpdlrun: %s, %d rank%s (dp=%d tp=%d pp=%d cp=%d)%s%s, steps %" PRId64 "..%" PRId64 ", %s %s/step, %s %s%s, data %s (%s)\n",
            a->model ? a->model : a->program_name ? a->program_name : "model", comm->world_size, comm->world_size == 1 ? "" : "s",
            a->layout.dp, a->layout.tp, a->layout.pp, a->layout.cp, o->threads ? ", " : "", o->threads ? o->threads : "", R.start_step + 1,
            R.steps, tok, images ? "images" : "tokens", optimizer, R.prog->name, gemm16, o->data ? o->data : a->data,
            what);
    fflush(R.out);
  }
  report_state(&R);

  int rc = 0;
  double t_start = rt_now(), run_time = 0;
  int64_t log_steps = 0;
  double log_time = 0;
  sum->first_step = R.start_step;
  sum->last_step = R.start_step;
  sum->total_steps = R.steps;
  int64_t end = o->stop_at > 0 && o->stop_at < R.steps ? o->stop_at : R.steps;
  /* HPDL_PROFILE: where each step's time goes, reported at the end */
  int phases = getenv("HPDL_PROFILE") != NULL;
  double t_data = 0, t_prog = 0, t_update = 0;
  /* from here a SIGTERM or SIGINT stops the run at a step's end, saved
   * (before, it ends the process: there is nothing to save yet) */
  rt_stop_catch();
  int64_t sleep_ms = rt_fault("step-sleep-ms"); /* tests: a slow step to signal in */
  /* tests: a NaN in the first value of each owned shard of parameter nan_param's gradient at step nan_step */
  int64_t nan_step = rt_fault("grad-nan-step"), nan_param = rt_fault("grad-nan-param");
  /* tests: rank die_rank killed (SIGKILL) at the start of step die_step */
  int64_t die_step = rt_fault("rank-die-step"), die_rank = rt_fault("rank-die-rank");
  /* --profile: time 0 of every rank's timeline at one barrier; from here
   * every collective is timed (comm_profile) */
  if (R.prof) {
    if (comm_barrier(comm, COMM_WORLD, e) < 0) fatal(&R, "the profile's barrier", e);
    prof_origin(R.prof);
    comm_profile(comm, R.prof);
    prof_enable(R.prof, 1);
  }
  for (int64_t s = R.start_step; s < end; s++) {
    for (struct timespec ts = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L}; sleep_ms > 0 && nanosleep(&ts, &ts) < 0 && errno == EINTR;) {
    }
    if (s + 1 == die_step && R.me == (die_rank > 0 ? die_rank : 0)) raise(SIGKILL);
    double t0 = rt_now(), tp = t0;
    double pt0 = R.prof ? prof_time(R.prof) : 0, pt = pt0; /* --profile: the step's start, the phase's */
    if (R.prof) prof_set_step(R.prof, s);
    R.ctx.step = s;
    if (next_micro(&R, R.loader, e) < 0) fatal(&R, "reading the data", e);
    if (R.prof) phase(&R, "data", &pt);
    if (R.master && !R.resident && gather_params(&R, e) < 0) fatal(&R, "gathering the parameters over dp (zero 3)", e);
    if (R.prof && R.master && !R.resident) phase(&R, "parameter gather", &pt);
    if (!R.resident) par_zero_f32(o->nthreads, R.pool[1], R.pool_cap ? R.pool_cap : 16);
    double loss = 0;
    int has_loss = 0;
    if (phases) {
      t_data += rt_now() - tp;
      tp = rt_now();
    }
    /* the seed: 1 / (dp x micro-batches), times fp16's loss scale */
    double used_scale = R.scale;
    R.ctx.grad_scale = used_scale / ((double)a->layout.dp * (double)a->num_micro_batches);
    if (R.prof) pt = prof_time(R.prof);
    if (R.prog->step(R.self, &R.ctx, R.mptr, R.nmicro, &loss, &has_loss, e) < 0) fatal(&R, "the program's step failed", e);
    if (R.prof) phase(&R, "program step", &pt);
    if (phases) {
      t_prog += rt_now() - tp;
      tp = rt_now();
    }
    if (!R.resident && sync_state(&R, e) < 0) fatal(&R, "sending the running statistics over dp", e);
    if (R.grad_own && !R.resident) {
      /* zero >= 2: each member gets the sum of its slice only; the whole
       * gradient pool is idle until the next step. */
      if (R.prog->reduces_dp) {
        memcpy(R.grad_own, R.pool[1] + R.own_lo, (size_t)R.own_len * sizeof(float));
        if (R.own2_len) memcpy(R.grad_own + R.own_len, R.pool[1] + R.own2_lo, (size_t)R.own2_len * sizeof(float));
      } else if (comm_reduce_scatter_compressed(comm, COMM_DP, &R.z, R.pool[1], R.own_len, R.grad_own, e) < 0) {
        fatal(&R, "the data-parallel gradient reduce-scatter", e);
      } else if (R.own2_len && comm_reduce_scatter(comm, COMM_EDP, COMM_F32, COMM_SUM, R.pool[1] + R.expert_lo, R.own2_len,
                                                   R.grad_own + R.own_len, e) < 0) {
        fatal(&R, "the expert-data-parallel gradient reduce-scatter", e);
      }
      rt_release_pages(R.pool[1], (size_t)R.pool_cap * sizeof(float));
    } else if (a->layout.dp > 1 && !R.prog->reduces_dp && !R.resident) {
      if (comm_allreduce_compressed(comm, COMM_DP, &R.z, R.pool[1], R.expert_lo, e) < 0)
        fatal(&R, "the data-parallel gradient all-reduce", e);
      if (R.pool_len > R.expert_lo && comm->size[COMM_EDP] > 1 &&
          comm_all_reduce(comm, COMM_EDP, COMM_F32, COMM_SUM, R.pool[1] + R.expert_lo, R.pool_len - R.expert_lo, e) < 0)
        fatal(&R, "the expert-data-parallel gradient all-reduce", e);
    }
    if (R.prof && !R.resident && (R.grad_own || (a->layout.dp > 1 && !R.prog->reduces_dp))) phase(&R, "gradient reduction", &pt);
    else if (R.prof) pt = prof_time(R.prof);
    /* One reduction for the gradient norm and the loss: [sum of squares,
     * loss x has, has]. Each logical value counts once: its tp / cp group's
     * representative counts it, over the owned range; at zero 0 every dp
     * member owns everything, so only member 0 counts. */
    for (int i = 0; i < R.ctx.ntensors && s + 1 == nan_step && !R.resident; i++) {
      int64_t lo, hi;
      if (R.ctx.tensors[i].param - a->params == (nan_param > 0 ? nan_param : 0) && owned_part(&R, i, &lo, &hi)) *grad_at(&R, lo) = NAN;
    }
    /* and the stop requests (rt.h): [SIGTERM, SIGINT, through the launcher] */
    int via_launcher = 0;
    RtStopKind asked = rt_stop_requested(&via_launcher);
    /* and whether a background checkpoint that has finished failed (rank 0
     * writes them): reported at the step it is seen, not at the next save */
    int save_failed = R.me == 0 && R.thr_live && __atomic_load_n(&R.job->done, __ATOMIC_ACQUIRE) && join_save(&R, e) < 0;
    /* [7]: the auxiliary losses (std/moe's load balance), counted once per
     * tensor / context group and averaged over data parallelism; [8] any */
    int aux_rep = R.ctx.has_aux && comm->coords.tp == 0 && comm->coords.cp == 0;
    double red[9] = {0, has_loss ? loss : 0, has_loss ? 1 : 0, asked == RT_STOP_TERM, asked == RT_STOP_INT, via_launcher, save_failed,
                     aux_rep ? R.ctx.aux_loss / (double)a->layout.dp : 0, R.ctx.has_aux};
    if (R.resident) {
      if (R.prog->grad_sumsq(R.self, &R.ctx, R.count, &red[0], e) < 0) fatal(&R, "the gradient norm on the device", e);
    } else
      for (int i = 0; i < R.ctx.ntensors; i++) {
        int64_t lo, hi;
        if (R.norm_rep[i] && (R.zero > 0 || dp_first(R.c, &R.ctx.tensors[i])) && owned_part(&R, i, &lo, &hi))
          red[0] += optim_sumsq_mt(o->nthreads, grad_at(&R, lo), hi - lo);
      }
    if (comm_all_reduce(comm, COMM_WORLD, COMM_F64, COMM_SUM, red, 9, e) < 0) fatal(&R, "reducing the loss", e);
    if (red[6] > 0) { /* rank 0's e holds the message */
      *reporter = R.me == 0;
      rc = -1;
      break;
    }
    if (R.prof) phase(&R, "norm", &pt);
    RtStopKind stop = red[3] > 0 ? RT_STOP_TERM : red[4] > 0 ? RT_STOP_INT : RT_STOP_NONE;
    /* the gradients hold used_scale x their values: the norm is unscaled */
    double gnorm = sqrt(red[0]) / used_scale, mean_loss = red[2] > 0 ? red[1] / red[2] : NAN;
    double lr = optim_lr_at(&R.opt, s);
    /* fp16: gradients that are not finite skip the step and halve a dynamic
     * scale, down to LOSS_SCALE_MIN; below it the run has diverged. Every
     * rank sees the same reduced values, so all decide the same. */
    int skip = R.scaling && (!isfinite(mean_loss) || !isfinite(gnorm)) && (!R.scale_dynamic || used_scale * 0.5 >= LOSS_SCALE_MIN);
    if (skip) {
      R.skipped++;
      R.scale_good = 0;
      if (R.scale_dynamic) R.scale = used_scale * 0.5;
      if (R.out)
        fprintf(R.out, "%shpdlrun: step %" PRId64 ": %s at loss scale %.17g: the step is skipped, the scale %s %.17g\n",
                R.tty ? "\r\033[K" : "", s + 1, isfinite(mean_loss) ? "gradients not finite" : "the loss is not finite", used_scale,
                R.scale_dynamic ? "is now" : "stays (static)", R.scale);
    } else if (!isfinite(mean_loss) || !isfinite(gnorm)) {
      /* Every rank sees the same reduced values, so all stop here together,
       * saying which gradient went bad first (the device's are not examined) */
      char bad[300], what[800] = "";
      int64_t nbad = R.resident ? 0 : first_bad_gradient(&R, bad, sizeof bad);
      if (nbad > 0)
        snprintf(what, sizeof what, "; the first gradient in the model's order with values that are not finite: %s (%" PRId64 " of them)",
                 bad, nbad);
      else if (!R.resident && !isfinite(mean_loss))
        snprintf(what, sizeof what, "; every gradient is finite, the loss is not");
      if (R.scaling)
        snprintf(what + strlen(what), sizeof what - strlen(what), "; the loss scale is %g, the smallest a dynamic scale takes, after %" PRId64
                 " skipped steps", used_scale, R.skipped);
      rt_fail(e, "step %" PRId64 ": the loss is %g and the gradient norm %g (lr %.3g): the run diverged%s", s + 1, mean_loss, gnorm, lr,
              what);
      *reporter = R.me == 0;
      rc = -1;
      break;
    }
    /* clipping and unscaling: the update's factor on the gradients */
    double scale = optim_clip_scale(gnorm, R.opt.clip) / used_scale;
    if (!skip) {
      R.updates++;
      if (R.scale_dynamic && ++R.scale_good >= R.scale_window) {
        R.scale = fmin(used_scale * 2, 18446744073709551616.0); /* 2^64: the checkpoint's bound */
        R.scale_good = 0;
      }
    }
    if (!skip && R.resident && R.prog->update(R.self, &R.ctx, &R.opt, R.updates, lr, scale, e) < 0) fatal(&R, "the update on the device", e);
    /* The update of the owned values, tensor by tensor (weight decay is per
     * tensor); at zero 0 that is every value. */
    for (int i = 0; i < R.ctx.ntensors && !R.resident && !skip; i++) {
      int64_t lo, hi;
      if (!owned_part(&R, i, &lo, &hi)) continue;
      const TrainTensor *x = &R.ctx.tensors[i];
      if (x->param->state) continue; /* running statistics: the forward's, not the optimizer's */
      double wd = x->param->weight_decay ? R.opt.weight_decay : 0.0;
      float *m = R.pool[2] ? R.pool[2] + state_index(&R, lo) : NULL, *v = R.pool[3] ? R.pool[3] + state_index(&R, lo) : NULL;
      /* the program's bf16 copy, written with the update where it updates the whole tensor in place */
      uint16_t *half = R.ctx.half[i] && !R.master && lo == R.offset[i] && hi - lo == x->numel ? R.ctx.half[i] : NULL;
      uint16_t *m16 = R.pool16[0] ? R.pool16[0] + state_index(&R, lo) : NULL, *v16 = R.pool16[1] ? R.pool16[1] + state_index(&R, lo) : NULL;
      if (R.opt.kind == OPTIM_ADAMW && m16)
        optim_adamw16_mt(o->nthreads, param_at(&R, lo), grad_at(&R, lo), m16, v16, hi - lo, R.updates, lr, wd, &R.opt, scale, half);
      else if (R.opt.kind == OPTIM_ADAMW)
        optim_adamw_mt(o->nthreads, param_at(&R, lo), grad_at(&R, lo), m, v, hi - lo, R.updates, lr, wd, &R.opt, scale, half);
      else if (m16) optim_sgd16_mt(o->nthreads, param_at(&R, lo), grad_at(&R, lo), m16, hi - lo, R.updates, lr, wd, &R.opt, scale, half);
      else optim_sgd_mt(o->nthreads, param_at(&R, lo), grad_at(&R, lo), m, hi - lo, R.updates, lr, wd, &R.opt, scale, half);
      if (half) R.ctx.half_step[i] = s + 1;
    }
    if (R.master) rt_release_pages(R.pool[0], (size_t)R.pool_cap * sizeof(float));
    else if (R.zero > 0 && !R.resident && (comm_all_gather(comm, COMM_DP, COMM_F32, R.pool[0] + R.own_lo, R.own_len, R.pool[0], e) < 0 ||
                            (R.own2_len && comm_all_gather(comm, COMM_EDP, COMM_F32, R.pool[0] + R.own2_lo, R.own2_len,
                                                           R.pool[0] + R.expert_lo, e) < 0)))
      fatal(&R, "gathering the updated parameters over dp", e);
    if (R.prof) phase(&R, "optimizer update", &pt);
    double dt = rt_now() - t0;
    if (phases) t_update += rt_now() - tp;
    run_time += dt;
    log_time += dt;
    log_steps++;
    if (s == R.start_step) sum->first_loss = mean_loss;
    sum->last_loss = mean_loss;
    sum->last_step = s + 1;
    /* --eval-every: the validation loss after this step (outside the step's time) */
    double val_loss = NAN;
    int at_eval = o->eval_every > 0 && ((s + 1) % o->eval_every == 0 || s + 1 == end) && stop == RT_STOP_NONE;
    if (at_eval && evaluate(&R, s, &val_loss, e) < 0) fatal(&R, "the validation pass (--eval-every)", e);
    if (R.metrics) {
      fprintf(R.metrics, "{\"step\": %" PRId64 ", ", s + 1);
      json_num(R.metrics, "loss", mean_loss, 0);
      json_num(R.metrics, "lr", lr, 0);
      json_num(R.metrics, "grad_norm", gnorm, 0);
      if (red[8] > 0) json_num(R.metrics, "aux_loss", red[7], 0);
      if (at_eval) json_num(R.metrics, "val_loss", val_loss, 0);
      if (R.scaling) {
        json_num(R.metrics, "loss_scale", used_scale, 0);
        fprintf(R.metrics, "\"skipped\": %s, ", skip ? "true" : "false");
      }
      if (images) json_num(R.metrics, "images_per_s", (double)tokens_per_step / dt, 0);
      json_num(R.metrics, "tokens_per_s", (double)tokens_per_step / dt, 0);
      json_num(R.metrics, "step_s", dt, 0);
      json_num(R.metrics, "elapsed_s", rt_now() - t_start, 1);
      fprintf(R.metrics, "}\n");
      fflush(R.metrics);
    }
    int last = s + 1 == end || stop, at_log = (s + 1) % R.log_every == 0 || last || s == R.start_step;
    if (R.out && (R.tty || at_log)) {
      char tps[32], eta[32];
      human(tps, sizeof tps, (double)tokens_per_step * (double)log_steps / log_time);
      clock_str(eta, sizeof eta, run_time / (double)(s + 1 - R.start_step) * (double)(end - s - 1));
      int w = 1;
      for (int64_t v = R.steps; v >= 10; v /= 10) w++;
      fprintf(R.out, "%sstep %*" PRId64 "/%" PRId64 " | loss %.4f | lr %.3e | norm %.4f | %s %s/s | %.1f ms/step | ETA %s%s",
              R.tty ? "\r\033[K" : "", w, s + 1, R.steps, mean_loss, lr, gnorm, tps, images ? "img" : "tok", 1e3 * log_time / (double)log_steps,
              eta, (!R.tty || at_log) ? "\n" : "");
      if (at_eval)
        fprintf(R.out, "%sstep %*" PRId64 "/%" PRId64 " | val loss %.4f (%" PRId64 " steps of validation data, evaluation mode)\n",
                R.tty && !at_log ? "\n" : "", w, s + 1, R.steps, val_loss, o->eval_steps > 0 ? o->eval_steps : 10);
      fflush(R.out);
      if (at_log) {
        log_steps = 0;
        log_time = 0;
      }
    }
    /* a stop request saves to any folder it has, the artifact's too */
    int due = R.ckpt_every > 0 && (s + 1) % R.ckpt_every == 0;
    if (R.ckpt_dir && (due || (last && save_final) || stop)) {
      if (R.resident && R.prog->state(R.self, &R.ctx, 1, e) < 0) fatal(&R, "bringing the state from the device", e);
      if (R.prof) pt = prof_time(R.prof);
      if (save_checkpoint(&R, s + 1, e) < 0) {
        rc = -1;
        *reporter = R.me == 0;
        break;
      }
      if (R.prof) phase(&R, "checkpoint", &pt);
    }
    if (R.prof) { /* the step's span, over its phases */
      ProfArgs sa = PROF_ARGS_NONE;
      sa.cat = "step";
      prof_span(R.prof, PROF_STEP, "step", pt0, prof_time(R.prof), &sa);
      prof_set_step(R.prof, -1);
    }
    if (stop) {
      sum->stop_status = rt_stop_exit_status(stop);
      sum->stop_via_launcher = red[5] > 0;
      if (R.out)
        fprintf(R.out, "hpdlrun: %s: stopped after step %" PRId64 " of %" PRId64 "%s\n", rt_stop_signal_name(stop), s + 1, R.steps,
                R.ckpt_dir ? "; --resume goes on from its checkpoint" : "; no checkpoint folder (--checkpoint-dir), so nothing was saved");
      break;
    }
  }
  rt_stop_release();
  if (R.prof) prof_enable(R.prof, 0); /* the timeline ends with the last step */
  if (phases && R.out && sum->last_step > sum->first_step) {
    double n = (double)(sum->last_step - sum->first_step);
    fprintf(R.out, "hpdlrun: step phases (HPDL_PROFILE, mean of %.0f steps): data %.1f ms, the program's step %.1f ms, reduction, norm and update %.1f ms\n",
            n, 1e3 * t_data / n, 1e3 * t_prog / n, 1e3 * t_update / n);
  }
  /* Wait for a background checkpoint; its failure fails the run. */
  if (rc == 0) {
    int f = R.me == 0 && join_save(&R, e) < 0;
    if (agree(&R, f) >= 0) {
      *reporter = R.me == 0;
      rc = -1;
    }
  }
  if (R.prof) {
    if (rc == 0) {
      int f = profile_finish(&R, e) < 0;
      if (agree(&R, f) >= 0) {
        *reporter = R.me == 0;
        rc = -1;
      }
    }
  }
  sum->seconds = run_time;
  sum->tokens_per_s = run_time > 0 ? (double)tokens_per_step * (double)(sum->last_step - sum->first_step) / run_time : 0;
  snprintf(sum->last_checkpoint, sizeof sum->last_checkpoint, "%s", R.last_ckpt);
  teardown(&R);
  return rc;
}
