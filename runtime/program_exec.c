/* program_exec.c - the CPU program of a compiled artifact: one shared
 * object (DIR/program.so, built once as hpdl-program.so and copied there
 * by `hpdlc compile`) that every rank loads. It exports hpdl_program_v1
 * (train.h) and runs this rank's pipeline chunk for each micro-batch.
 *
 * create: reads DIR/manifest.json's `ranks[r]` for the rank's chunk file
 * (`module`, program_ir.h) and, when the back end compiled it, the chunk's
 * kernels (`kernels`, a library of compiler/codegen.h's ABI); maps every
 * parameter copy the chunk reads to this rank's TrainTensor (by name and
 * layer) or, for a copy another stage holds (the tied embedding on the last
 * stage), to a mirror of its own.
 *
 * step: copies the parameters in, receives the mirrors from their stages,
 * runs the chunk's training step (autodiff.h's forward.grad) once per
 * micro-batch with seed grad_scale, so that its gradient store holds
 * exactly what the runtime wants added; sends the mirrors' gradients to
 * their owners, who add them; adds the gradients to the TrainTensors.
 * Forward and backward of a micro-batch run back to back and pipeline
 * transfers block until the peer arrives, so the stages run in lockstep
 * (one micro-batch in flight; the numbers are the same under any schedule,
 * sim.h); the data-parallel reduction is the runtime's.
 *
 * Two executors run a stage's step:
 *   native  the back end's generated code (codegen.h: hpd_graph_<step>),
 *           fp32, collectives through hpd_ctx's callbacks on fp32 data;
 *   interp  the reference executor (interp.h), fp64 throughout: parameters
 *           are widened from the runtime's fp32, gradients narrowed back,
 *           collectives run on fp64 data.
 * A stage runs native when the manifest names kernels for its ranks
 * (ranks[r].kernels; hpdlc compile leaves them out of a stage the back end
 * cannot compile), else interp; HPDL_EXECUTOR=interp in the environment
 * forces the reference everywhere, as an oracle on the same artifact.
 * Between stages, messages travel in program.pipeline_dtype (f64 when no
 * stage has kernels, else f32), so the two kinds of stage can meet. */
#include <dlfcn.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interp.h"
#include "program_ir.h"
#include "train.h"

#define HPD_ABI_ONLY
#include "codegen.h"

/* Tags keep the kinds of point-to-point messages apart (MPI matches by
 * source, tag and communicator; within one tag, messages keep their order). */
enum { TAG_ACT = 31, TAG_TIE_PARAM = 32, TAG_TIE_GRAD = 33, TAG_RING = 34 };

/* A send around the context-parallel ring (ring attention), held until the
 * matching receive: see ring_recv. */
typedef struct Pending {
  void *data;
  int64_t n;
  int offset;
  struct Pending *next;
} Pending;

typedef struct {
  const ProgramUse *u;
  const IrParam *p;
  TrainTensor *t;   /* this rank's tensor, or NULL for a mirror */
  int64_t numel;    /* local values of one copy */
  double *ival;     /* interp: the copy's values inside the executor */
  float *fval;      /* native: the copy inside the parameter slot */
  float *fgrad;     /* native: its gradient inside the gradient slot */
} Use;

typedef struct {
  TrainCtx *ctx;
  Comm *comm;
  Arena *arena;
  ProgramChunk *pc;
  int stage, last;
  Use *uses;
  int nuses;
  RtErr cerr;        /* the last collective's message */
  /* Messages between pipeline stages (activations, their gradients, the
   * mirrors) travel in one type the whole job agrees on (the manifest's
   * program.pipeline_dtype): fp64 when every stage runs the reference
   * executor, else fp32, so that a stage of generated code and a stage of
   * the reference executor understand each other. */
  CommType wire;
  void *wbuf;        /* conversion to and from the wire type */
  int64_t wcap;
  Pending *ring_head, *ring_tail; /* context-parallel sends not yet exchanged */
  double *scratch;   /* a mirror's incoming gradient */
  int64_t scratch_len;
  /* interp */
  Interp *in;
  double **inputs;   /* per model input, as doubles */
  /* native */
  void *dl;
  const hpd_module_desc *mod;
  const hpd_graph_desc *entry;
  hpd_ctx hctx;
  void **table;
  float **pslot, **gslot; /* per parameter: all copies */
  char *inplace;     /* per parameter: its slots are the runtime's tensors (map_inplace) */
  float *fscratch;
  void *workspace_own;
} Exec;

static int fail(RtErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(RtErr *e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return -1;
}

/* The Comm's table directly: the program links nothing of libhpdlrt. */
static int c_all_reduce(Comm *c, CommGroup g, CommType t, CommOp op, void *buf, int64_t n, RtErr *e) {
  return c->ops->all_reduce(c, g, t, op, buf, n, e);
}
static int c_all_gather(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  return c->ops->all_gather(c, g, t, in, n, out, e);
}
static int c_send(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  return c->ops->send(c, g, t, buf, n, peer, tag, e);
}
static int c_recv(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int peer, int tag, RtErr *e) {
  return c->ops->recv(c, g, t, buf, n, peer, tag, e);
}

/* Puts "what: " before the message already in e. */
static int prefix(RtErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int prefix(RtErr *e, const char *fmt, ...) {
  char tail[RT_ERR_LEN];
  memcpy(tail, e->msg, sizeof tail);
  tail[sizeof tail - 1] = 0;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof e->msg) {
    size_t at = (size_t)n, room = sizeof e->msg - at;
    if (room > 2) {
      memcpy(e->msg + at, ": ", 2);
      at += 2;
      room -= 2;
      size_t k = strlen(tail) < room - 1 ? strlen(tail) : room - 1;
      memcpy(e->msg + at, tail, k);
      e->msg[at + k] = 0;
    }
  }
  return -1;
}

static int comm_type_size_of(CommType t) { return t == COMM_F64 ? 8 : t == COMM_U8 ? 1 : 4; }

static const char *comm_group_name_of(CommGroup g) {
  static const char *const n[COMM_NGROUPS] = {"world", "dp", "tp", "pp", "cp"};
  return n[g];
}

static CommGroup group_of(int g) {
  switch (g) {
  case IRG_DP: return COMM_DP;
  case IRG_TP: return COMM_TP;
  case IRG_PP: return COMM_PP;
  default: return COMM_CP;
  }
}

static int64_t local_numel(const IrParam *p) {
  int64_t n = 1;
  for (int i = 0; i < p->rank; i++) n *= p->dims[i];
  return n;
}

static int64_t copies_of(const IrParam *p) { return p->count > 1 ? p->count : 1; }

/* ---- collectives for the reference executor (fp64) ---- */

static const char *ix_all_reduce(void *ctx, IrGroup g, int op, double *data, int64_t n) {
  Exec *x = ctx;
  return c_all_reduce(x->comm, group_of(g), COMM_F64, op ? COMM_MAX : COMM_SUM, data, n, &x->cerr) < 0 ? x->cerr.msg : NULL;
}

static const char *ix_all_gather(void *ctx, IrGroup g, const double *in, int64_t n, double *out) {
  Exec *x = ctx;
  return c_all_gather(x->comm, group_of(g), COMM_F64, in, n, out, &x->cerr) < 0 ? x->cerr.msg : NULL;
}

/* ---- point-to-point in the wire type ---- */

static int wire_room(Exec *x, int64_t n, RtErr *e) {
  if (n <= x->wcap) return 0;
  void *b = realloc(x->wbuf, (size_t)n * sizeof(double));
  if (!b) return fail(e, "out of memory for a message of %" PRId64 " values", n);
  x->wbuf = b;
  x->wcap = n;
  return 0;
}

/* buf holds n values of type `have` (COMM_F64 for the reference executor,
 * COMM_F32 for generated code); they go out in the wire type. */
static int wire_send(Exec *x, CommGroup g, CommType have, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  if (have == x->wire) return c_send(x->comm, g, have, buf, n, peer, tag, e);
  if (wire_room(x, n, e) < 0) return -1;
  if (have == COMM_F64)
    for (int64_t i = 0; i < n; i++) ((float *)x->wbuf)[i] = (float)((const double *)buf)[i];
  else
    for (int64_t i = 0; i < n; i++) ((double *)x->wbuf)[i] = ((const float *)buf)[i];
  return c_send(x->comm, g, x->wire, x->wbuf, n, peer, tag, e);
}

static int wire_recv(Exec *x, CommGroup g, CommType have, void *buf, int64_t n, int peer, int tag, RtErr *e) {
  if (have == x->wire) return c_recv(x->comm, g, have, buf, n, peer, tag, e);
  if (wire_room(x, n, e) < 0 || c_recv(x->comm, g, x->wire, x->wbuf, n, peer, tag, e) < 0) return -1;
  if (have == COMM_F64)
    for (int64_t i = 0; i < n; i++) ((double *)buf)[i] = ((const float *)x->wbuf)[i];
  else
    for (int64_t i = 0; i < n; i++) ((float *)buf)[i] = (float)((const double *)x->wbuf)[i];
  return 0;
}

/* ---- the context-parallel ring ----
 *
 * Ring attention sends a block to the next member of the context group and
 * receives one from the previous, on every member at once. With blocking
 * transfers, every member sending first would wait for ever once messages
 * outgrow MPI's eager buffers; so a send on the ring is only queued, and the
 * receive that pairs with it (the members run the same program, so the
 * k-th receive pairs with the k-th send) does the exchange: even members
 * send then receive, odd ones receive then send, which breaks the cycle on
 * rings of any size. The ring wraps around: a member's neighbour at offset
 * o is (rank + o) mod size. Messages stay in the executor's own type (all
 * members of a context group run the same stage). */

static int ring_send(Exec *x, CommType t, const void *data, int64_t n, int offset, RtErr *e) {
  Pending *q = calloc(1, sizeof *q);
  size_t bytes = (size_t)n * (size_t)comm_type_size_of(t);
  if (!q || !(q->data = malloc(bytes ? bytes : 1))) {
    free(q);
    return fail(e, "out of memory for a context-parallel message of %" PRId64 " values", n);
  }
  memcpy(q->data, data, bytes);
  q->n = n;
  q->offset = offset;
  if (x->ring_tail) x->ring_tail->next = q;
  else x->ring_head = q;
  x->ring_tail = q;
  return 0;
}

static int ring_recv(Exec *x, CommType t, void *data, int64_t n, int offset, RtErr *e) {
  Pending *q = x->ring_head;
  if (!q) return fail(e, "a context-parallel receive with no send before it (the ring's transfers do not pair)");
  if (q->offset != -offset || q->n != n)
    return fail(e, "a context-parallel receive (offset %d, %" PRId64 " values) does not pair with the send before it (offset %d, %" PRId64
                   " values)", offset, n, q->offset, q->n);
  x->ring_head = q->next;
  if (!x->ring_head) x->ring_tail = NULL;
  int me = x->comm->rank[COMM_CP], size = x->comm->size[COMM_CP];
  int to = ((me + q->offset) % size + size) % size, from = ((me + offset) % size + size) % size;
  int rc;
  if (me % 2 == 0) {
    rc = c_send(x->comm, COMM_CP, t, q->data, n, to, TAG_RING, e);
    if (rc == 0) rc = c_recv(x->comm, COMM_CP, t, data, n, from, TAG_RING, e);
  } else {
    rc = c_recv(x->comm, COMM_CP, t, data, n, from, TAG_RING, e);
    if (rc == 0) rc = c_send(x->comm, COMM_CP, t, q->data, n, to, TAG_RING, e);
  }
  free(q->data);
  free(q);
  return rc;
}

static void ring_clear(Exec *x) {
  while (x->ring_head) {
    Pending *q = x->ring_head;
    x->ring_head = q->next;
    free(q->data);
    free(q);
  }
  x->ring_tail = NULL;
}

/* Pipeline stages form a line: the peer `offset` stages away must exist. */
static int pp_peer(Exec *x, int offset, RtErr *e) {
  int peer = x->comm->rank[COMM_PP] + offset;
  if (peer < 0 || peer >= x->comm->size[COMM_PP])
    return fail(e, "stage %d: a transfer to stage %d, which does not exist", x->comm->rank[COMM_PP], peer);
  return peer;
}

/* Point-to-point for both executors: `have` is the type of data. */
static int p2p_send(Exec *x, int g, CommType have, const void *data, int64_t n, int offset, RtErr *e) {
  if (g == IRG_CP) return ring_send(x, have, data, n, offset, e);
  if (g != IRG_PP) return fail(e, "a transfer over the %s group, which has no neighbours", comm_group_name_of(group_of(g)));
  int peer = pp_peer(x, offset, e);
  return peer < 0 ? -1 : wire_send(x, COMM_PP, have, data, n, peer, TAG_ACT, e);
}

static int p2p_recv(Exec *x, int g, CommType have, void *data, int64_t n, int offset, RtErr *e) {
  if (g == IRG_CP) return ring_recv(x, have, data, n, offset, e);
  if (g != IRG_PP) return fail(e, "a transfer over the %s group, which has no neighbours", comm_group_name_of(group_of(g)));
  int peer = pp_peer(x, offset, e);
  return peer < 0 ? -1 : wire_recv(x, COMM_PP, have, data, n, peer, TAG_ACT, e);
}

static const char *ix_send(void *ctx, IrGroup g, int offset, const double *data, int64_t n) {
  Exec *x = ctx;
  return p2p_send(x, g, COMM_F64, data, n, offset, &x->cerr) < 0 ? x->cerr.msg : NULL;
}

static const char *ix_recv(void *ctx, IrGroup g, int offset, double *data, int64_t n) {
  Exec *x = ctx;
  return p2p_recv(x, g, COMM_F64, data, n, offset, &x->cerr) < 0 ? x->cerr.msg : NULL;
}

/* ---- collectives for generated code (fp32; codegen.h's hpd_ctx) ---- */

static int nx_all_reduce(void *comm, int group, int op, float *data, int64_t n) {
  Exec *x = comm;
  if (c_all_reduce(x->comm, group_of(group), COMM_F32, op ? COMM_MAX : COMM_SUM, data, n, &x->cerr) < 0) {
    x->hctx.error = x->cerr.msg;
    return -1;
  }
  return 0;
}

static int nx_all_gather(void *comm, int group, const float *in, int64_t n, float *out) {
  Exec *x = comm;
  if (c_all_gather(x->comm, group_of(group), COMM_F32, in, n, out, &x->cerr) < 0) {
    x->hctx.error = x->cerr.msg;
    return -1;
  }
  return 0;
}

static int nx_send(void *comm, int group, int offset, const float *data, int64_t n) {
  Exec *x = comm;
  if (p2p_send(x, group, COMM_F32, data, n, offset, &x->cerr) < 0) {
    x->hctx.error = x->cerr.msg;
    return -1;
  }
  return 0;
}

static int nx_recv(void *comm, int group, int offset, float *data, int64_t n) {
  Exec *x = comm;
  if (p2p_recv(x, group, COMM_F32, data, n, offset, &x->cerr) < 0) {
    x->hctx.error = x->cerr.msg;
    return -1;
  }
  return 0;
}

/* ---- set-up ---- */

/* The rank's entry of the manifest's `ranks` (fields the runtime's reader
 * ignores): module, kernels; and program.pipeline_dtype. */
static int read_rank_entry(const Artifact *a, int rank, char *module, char *kernels, size_t n, CommType *wire, RtErr *e) {
  json_error_t je;
  json_t *root = json_load_file(a->manifest_path, 0, &je);
  if (!root) return fail(e, "%s: %s", a->manifest_path, je.text);
  json_t *jr = json_array_get(json_object_get(root, "ranks"), (size_t)rank);
  const char *mod = json_string_value(json_object_get(jr, "module"));
  const char *ker = json_string_value(json_object_get(jr, "kernels"));
  const char *wt = json_string_value(json_object_get(json_object_get(root, "program"), "pipeline_dtype"));
  int rc = 0;
  if (!mod) rc = fail(e, "%s: ranks[%d].module: the rank's chunk file is required (an artifact of hpdlc compile)", a->manifest_path, rank);
  else if (wt && strcmp(wt, "f32") && strcmp(wt, "f64"))
    rc = fail(e, "%s: program.pipeline_dtype: must be \"f32\" or \"f64\"", a->manifest_path);
  else {
    if ((size_t)snprintf(module, n, "%s/%s", a->dir, mod) >= n) rc = fail(e, "%s: path too long", mod);
    *wire = wt && !strcmp(wt, "f64") ? COMM_F64 : COMM_F32;
    kernels[0] = 0;
    if (ker && (size_t)snprintf(kernels, n, "%s/%s", a->dir, ker) >= n) rc = fail(e, "%s: path too long", ker);
  }
  json_decref(root);
  return rc;
}

static TrainTensor *find_tensor(TrainCtx *ctx, const char *name, int64_t layer) {
  for (int i = 0; i < ctx->ntensors; i++)
    if (ctx->tensors[i].layer == layer && !strcmp(ctx->tensors[i].param->name, name)) return &ctx->tensors[i];
  return NULL;
}

static int map_uses(Exec *x, RtErr *e) {
  TrainCtx *ctx = x->ctx;
  const ProgramChunk *pc = x->pc;
  x->nuses = pc->nuses;
  x->uses = calloc((size_t)(pc->nuses ? pc->nuses : 1), sizeof(Use));
  if (!x->uses) return fail(e, "out of memory");
  for (int i = 0; i < pc->nuses; i++) {
    Use *u = &x->uses[i];
    u->u = &pc->uses[i];
    u->p = &pc->m->params[u->u->param];
    u->numel = local_numel(u->p);
    if (u->numel > x->scratch_len) x->scratch_len = u->numel;
    if (u->u->owner != x->stage) continue;
    u->t = find_tensor(ctx, u->p->name, u->u->layer);
    if (!u->t)
      return fail(e, "the chunk reads %s (copy %" PRId64 ") on stage %d, but the manifest's parameter table does not put it there "
                     "(recompile the artifact)", u->p->name, u->u->layer, x->stage);
    if (u->t->numel != u->numel)
      return fail(e, "parameter %s: this rank's shard has %" PRId64 " values, the chunk's module %" PRId64 " (recompile the artifact)",
                  u->t->name, u->t->numel, u->numel);
  }
  return 0;
}

/* A parameter whose copies are all this rank's tensors, lying back to back in
 * the runtime's pools as they do in a slot (a repeated block's layers in
 * order), is used in place: the kernels read the weights and add the
 * gradients (which the runtime zeroed) where the runtime keeps them, saving
 * a copy of every weight in, a zeroing, and a gradient sum out per step. */
static int map_inplace(Exec *x, RtErr *e) {
  const IrModule *m = x->pc->m;
  x->inplace = calloc((size_t)m->nparams + 1, 1);
  if (!x->inplace) return fail(e, "out of memory");
  for (int p = 0; p < m->nparams; p++) {
    const IrParam *P = &m->params[p];
    int64_t copies = copies_of(P), n = local_numel(P), found = 0;
    TrainTensor *first = NULL;
    int ok = 1;
    for (int i = 0; i < x->nuses && ok; i++) {
      const Use *u = &x->uses[i];
      if (u->u->param != p) continue;
      if (!u->t || u->u->layer < 0 || u->u->layer >= copies) {
        ok = 0; /* a mirror, or a copy we cannot place */
        break;
      }
      found++;
      if (u->u->layer == 0) first = u->t;
    }
    if (!ok || found != copies || !first) continue;
    for (int i = 0; i < x->nuses && ok; i++) {
      const Use *u = &x->uses[i];
      if (u->u->param != p) continue;
      ok = u->t->data == first->data + u->u->layer * n && u->t->grad == first->grad + u->u->layer * n;
    }
    if (!ok) continue;
    free(x->pslot[p]);
    free(x->gslot[p]);
    x->pslot[p] = first->data;
    x->gslot[p] = first->grad;
    x->inplace[p] = 1;
  }
  return 0;
}

static int native_open(Exec *x, const char *path, RtErr *e) {
  FILE *probe = fopen(path, "rb");
  if (!probe)
    return fail(e, "missing artifact file %s (named by %s's ranks[%d].kernels)", path, x->ctx->art->manifest_path,
                x->ctx->comm->world_rank);
  fclose(probe);
  x->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!x->dl) return fail(e, "%s: cannot load the chunk's kernels: %s", path, dlerror());
  x->mod = dlsym(x->dl, HPD_MODULE_SYMBOL);
  const IrModule *m = x->pc->m;
  if (!x->mod) return fail(e, "%s: not a kernel library (no symbol %s)", path, HPD_MODULE_SYMBOL);
  if (x->mod->abi_version != HPD_ABI_VERSION)
    return fail(e, "%s: kernel ABI version %d, this program speaks %d (recompile the artifact)", path, x->mod->abi_version, HPD_ABI_VERSION);
  if (x->mod->ngraphs != m->ngraphs || x->mod->ninputs != m->ninputs || x->mod->nparams != m->nparams)
    return fail(e, "%s: the kernels were compiled from another module than the chunk file (recompile the artifact)", path);
  x->entry = &x->mod->graphs[x->pc->step];
  const IrGraph *g = m->graphs[x->pc->step];
  if (strcmp(x->entry->name, g->name) || x->entry->nargs != 1 || x->entry->noutputs < 1)
    return fail(e, "%s: graph %s is not the chunk's step", path, x->entry->name);
  int np = m->nparams;
  x->pslot = calloc((size_t)np + 1, sizeof(float *));
  x->gslot = calloc((size_t)np + 1, sizeof(float *));
  x->table = calloc((size_t)x->entry->nbuffers + 1, sizeof(void *));
  if (!x->pslot || !x->gslot || !x->table) return fail(e, "out of memory");
  for (int p = 0; p < np; p++) {
    const IrParam *P = &m->params[p];
    size_t n = (size_t)(local_numel(P) * copies_of(P));
    x->pslot[p] = calloc(n ? n : 1, sizeof(float));
    x->gslot[p] = calloc(n ? n : 1, sizeof(float));
    if (!x->pslot[p] || !x->gslot[p]) return fail(e, "out of memory for parameter %s", P->name);
  }
  if (map_inplace(x, e) < 0) return -1;
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    x->uses[i].fval = x->pslot[u->u->param] + u->u->layer * u->numel;
    x->uses[i].fgrad = x->gslot[u->u->param] + u->u->layer * u->numel;
  }
  /* The memory planner's arena serves as the workspace when it is large
   * enough (the runtime allocated it, 64-byte aligned); else one of our own. */
  int64_t need = x->entry->workspace_bytes;
  if (need <= x->ctx->arena_bytes) x->hctx.workspace = x->ctx->arena;
  else {
    x->workspace_own = aligned_alloc(64, (size_t)((need + 63) / 64 * 64));
    if (!x->workspace_own) return fail(e, "out of memory for the kernels' workspace (%" PRId64 " bytes)", need);
    x->hctx.workspace = x->workspace_own;
  }
  x->fscratch = calloc((size_t)(x->scratch_len ? x->scratch_len : 1), sizeof(float));
  if (!x->fscratch) return fail(e, "out of memory");
  x->hctx.seed = (uint64_t)x->ctx->art->seed;
  x->hctx.comm = x;
  x->hctx.all_reduce = nx_all_reduce;
  x->hctx.all_gather = nx_all_gather;
  x->hctx.send = nx_send;
  x->hctx.recv = nx_recv;
  static const CommGroup groups[4] = {COMM_DP, COMM_TP, COMM_PP, COMM_CP};
  for (int k = 0; k < 4; k++) {
    x->hctx.rank[k] = x->comm->rank[groups[k]];
    x->hctx.size[k] = x->comm->size[groups[k]];
  }
  return 0;
}

static int interp_open(Exec *x, RtErr *e) {
  const IrModule *m = x->pc->m;
  x->in = interp_new(m);
  /* The initial values are overwritten every step; the seed stays for
   * dropout's masks (interp.c draws them from it). */
  interp_init_params(x->in, (uint64_t)x->ctx->art->seed);
  InterpComm ic;
  memset(&ic, 0, sizeof ic);
  static const CommGroup groups[IRG_COUNT] = {COMM_DP, COMM_TP, COMM_PP, COMM_CP};
  for (int g = 0; g < IRG_COUNT; g++) {
    ic.rank[g] = x->comm->rank[groups[g]];
    ic.size[g] = x->comm->size[groups[g]];
  }
  ic.ctx = x;
  ic.all_reduce = ix_all_reduce;
  ic.all_gather = ix_all_gather;
  ic.send = ix_send;
  ic.recv = ix_recv;
  interp_set_comm(x->in, &ic);
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    int64_t n = 0;
    u->ival = interp_param(x->in, u->u->param, u->u->layer, &n);
    if (!u->ival || n != u->numel) return fail(e, "parameter %s has no copy %" PRId64 " in the chunk", u->p->name, u->u->layer);
  }
  x->inputs = calloc((size_t)m->ninputs + 1, sizeof(double *));
  x->scratch = calloc((size_t)(x->scratch_len ? x->scratch_len : 1), sizeof(double));
  if (!x->inputs || !x->scratch) return fail(e, "out of memory");
  for (int i = 0; i < m->ninputs; i++) {
    int64_t n = 1;
    for (int k = 0; k < m->inputs[i].rank; k++) n *= m->inputs[i].dims[k];
    if (!(x->inputs[i] = calloc((size_t)n, sizeof(double)))) return fail(e, "out of memory");
  }
  return 0;
}

static void exec_free(Exec *x) {
  if (!x) return;
  if (x->in) interp_free(x->in);
  if (x->inputs && x->pc)
    for (int i = 0; i < x->pc->m->ninputs; i++) free(x->inputs[i]);
  free(x->inputs);
  free(x->scratch);
  if (x->pslot && x->pc)
    for (int p = 0; p < x->pc->m->nparams; p++) {
      if (x->inplace && x->inplace[p]) continue;
      free(x->pslot[p]);
      free(x->gslot[p]);
    }
  free(x->pslot);
  free(x->gslot);
  free(x->table);
  free(x->inplace);
  free(x->fscratch);
  free(x->wbuf);
  ring_clear(x);
  free(x->workspace_own);
  if (x->dl) dlclose(x->dl);
  free(x->uses);
  if (x->arena) arena_free(x->arena);
  free(x);
}

static void *exec_create(TrainCtx *ctx, RtErr *e) {
  const Artifact *a = ctx->art;
  Exec *x = calloc(1, sizeof *x);
  if (!x) {
    fail(e, "out of memory");
    return NULL;
  }
  x->ctx = ctx;
  x->comm = ctx->comm;
  x->stage = ctx->comm->coords.pp;
  x->last = x->stage == a->layout.pp - 1;
  char module[4096], kernels[4096], why[768];
  if (read_rank_entry(a, ctx->comm->world_rank, module, kernels, sizeof module, &x->wire, e) < 0) goto bad;
  /* a stage with kernels runs them, unless the reference is asked for */
  int native = kernels[0] != 0;
  const char *force = getenv("HPDL_EXECUTOR");
  if (force && !strcmp(force, "interp")) native = 0;
  else if (force && !strcmp(force, "native") && !native) {
    fail(e, "HPDL_EXECUTOR=native, but stage %d of this artifact has no kernels (hpdlc compile --executor native)", x->stage);
    goto bad;
  }
  x->arena = arena_new();
  FILE *probe = fopen(module, "rb");
  if (!probe) {
    fail(e, "missing artifact file %s (named by %s's ranks[%d].module)", module, a->manifest_path, ctx->comm->world_rank);
    goto bad;
  }
  fclose(probe);
  x->pc = program_ir_read(x->arena, module, why, sizeof why);
  if (!x->pc) {
    fail(e, "%s", why);
    goto bad;
  }
  const ProgramChunk *pc = x->pc;
  const IrModule *m = pc->m;
  if (pc->nchunks != a->layout.pp || pc->chunk != x->stage) {
    fail(e, "%s: chunk %d of %d, but this rank is pipeline stage %d of %d (recompile the artifact)", module, pc->chunk, pc->nchunks,
         x->stage, a->layout.pp);
    goto bad;
  }
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *in = &m->inputs[i];
    if (in->rank != 2 || in->dims[0] != a->micro_batch || in->dims[1] != a->seq_len) {
      fail(e, "%s: input %s is not [micro_batch %" PRId64 ", seq_len %" PRId64 "] as the manifest says", module,
           in->name ? in->name : "?", a->micro_batch, a->seq_len);
      goto bad;
    }
  }
  if (map_uses(x, e) < 0) goto bad;
  if (native) {
    if (native_open(x, kernels, e) < 0) goto bad;
  } else if (interp_open(x, e) < 0) {
    goto bad;
  }
  return x;
bad:
  exec_free(x);
  return NULL;
}

/* ---- the step ---- */

/* Mirrors: the owner sends each copy (values before the step, gradients
 * after it) to the stages that read it too. Every rank walks the uses in
 * the same (parameter, layer) order, so sends and receives pair up without
 * a cycle of waits. */
static int tie_params(Exec *x, int native, RtErr *e) {
  CommType have = native ? COMM_F32 : COMM_F64;
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    void *buf = native ? (void *)u->fval : (void *)u->ival;
    if (u->u->owner == x->stage) {
      for (int k = 0; k < u->u->nmirrors; k++)
        if (wire_send(x, COMM_PP, have, buf, u->numel, u->u->mirrors[k], TAG_TIE_PARAM, e) < 0)
          return prefix(e, "sending %s to stage %d", u->p->name, u->u->mirrors[k]);
    } else if (wire_recv(x, COMM_PP, have, buf, u->numel, u->u->owner, TAG_TIE_PARAM, e) < 0) {
      return prefix(e, "receiving %s from stage %d", u->p->name, u->u->owner);
    }
  }
  return 0;
}

static int tie_grads(Exec *x, int native, RtErr *e) {
  CommType have = native ? COMM_F32 : COMM_F64;
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    if (u->u->owner == x->stage) {
      double *own = native ? NULL : interp_grad(x->in, u->u->param, u->u->layer, NULL);
      for (int k = 0; k < u->u->nmirrors; k++) {
        void *in = native ? (void *)x->fscratch : (void *)x->scratch;
        if (wire_recv(x, COMM_PP, have, in, u->numel, u->u->mirrors[k], TAG_TIE_GRAD, e) < 0)
          return prefix(e, "receiving the gradient of %s from stage %d", u->p->name, u->u->mirrors[k]);
        if (native) {
          for (int64_t j = 0; j < u->numel; j++) u->fgrad[j] += x->fscratch[j];
        } else if (own) {
          for (int64_t j = 0; j < u->numel; j++) own[j] += x->scratch[j];
        } else { /* the owner's store holds none (only the mirror differentiates this copy) */
          for (int64_t j = 0; j < u->numel; j++) u->t->grad[j] += (float)x->scratch[j];
        }
      }
    } else {
      const void *buf;
      if (native) buf = u->fgrad;
      else {
        double *g = interp_grad(x->in, u->u->param, u->u->layer, NULL);
        if (!g) memset(x->scratch, 0, sizeof(double) * (size_t)u->numel);
        buf = g ? g : x->scratch;
      }
      if (wire_send(x, COMM_PP, have, buf, u->numel, u->u->owner, TAG_TIE_GRAD, e) < 0)
        return prefix(e, "sending the gradient of %s to stage %d", u->p->name, u->u->owner);
    }
  }
  return 0;
}

static int step_interp(Exec *x, const DataBatch *const *micro, int nmicro, double *loss, RtErr *e) {
  const ProgramChunk *pc = x->pc;
  const IrModule *m = pc->m;
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    if (u->t)
      for (int64_t j = 0; j < u->numel; j++) u->ival[j] = (double)u->t->data[j];
  }
  if (tie_params(x, 0, e) < 0) return -1;
  interp_zero_grads(x->in);
  const IrGraph *sg = m->graphs[pc->step];
  InterpTensor *outs = calloc((size_t)sg->noutputs + 1, sizeof(InterpTensor));
  if (!outs) return fail(e, "out of memory");
  double total = 0;
  /* seed grad_scale: the store then holds grad_scale x the sum over the
   * micro-batches of d(mean loss)/d(param), what the runtime adds */
  double seed = x->ctx->grad_scale;
  InterpTensor s;
  memset(&s, 0, sizeof s);
  s.data = &seed;
  for (int k = 0; k < nmicro; k++) {
    const DataBatch *b = micro[k];
    for (int i = 0; i < m->ninputs; i++) {
      const int32_t *src = pc->feed[i] == PROGRAM_FEED_TARGETS ? b->targets : b->inputs;
      int64_t n = b->batch * b->seq_len;
      for (int64_t j = 0; j < n; j++) x->inputs[i][j] = (double)src[j];
      interp_set_input(x->in, i, x->inputs[i]);
    }
    const char *err = NULL;
    if (interp_run(x->in, pc->step, 0, &s, 1, outs, &err) != 0) {
      free(outs);
      return fail(e, "stage %d, micro-batch %d: %s", x->stage, k, err ? err : "the step failed");
    }
    total += outs[0].data[0];
    for (int j = 0; j < sg->noutputs; j++) {
      free(outs[j].data);
      outs[j].data = NULL;
    }
  }
  free(outs);
  if (tie_grads(x, 0, e) < 0) return -1;
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    if (!u->t) continue;
    const double *g = interp_grad(x->in, u->u->param, u->u->layer, NULL);
    if (g)
      for (int64_t j = 0; j < u->numel; j++) u->t->grad[j] += (float)g[j];
  }
  *loss = total / (double)nmicro;
  return 0;
}

static int step_native(Exec *x, const DataBatch *const *micro, int nmicro, double *loss, RtErr *e) {
  const ProgramChunk *pc = x->pc;
  const IrModule *m = pc->m;
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    if (u->t && !x->inplace[u->u->param]) memcpy(u->fval, u->t->data, sizeof(float) * (size_t)u->numel);
  }
  if (tie_params(x, 1, e) < 0) return -1;
  for (int p = 0; p < m->nparams; p++)
    if (!x->inplace[p]) memset(x->gslot[p], 0, sizeof(float) * (size_t)(local_numel(&m->params[p]) * copies_of(&m->params[p])));
  float seed = (float)x->ctx->grad_scale;
  const IrGraph *sg = m->graphs[pc->step];
  float **outs = calloc((size_t)x->entry->noutputs, sizeof(float *));
  int rc = outs ? 0 : fail(e, "out of memory");
  for (int j = 0; j < x->entry->noutputs && rc == 0; j++)
    if (!(outs[j] = calloc((size_t)ir_numel(&sg->nodes[sg->outputs[j]]), sizeof(float)))) rc = fail(e, "out of memory");
  double total = 0;
  for (int k = 0; k < nmicro && rc == 0; k++) {
    const DataBatch *b = micro[k];
    int n = 0;
    x->table[n++] = &x->hctx;
    for (int i = 0; i < m->ninputs; i++) x->table[n++] = pc->feed[i] == PROGRAM_FEED_TARGETS ? b->targets : b->inputs;
    for (int p = 0; p < m->nparams; p++) x->table[n++] = x->pslot[p];
    for (int p = 0; p < m->nparams; p++) x->table[n++] = x->gslot[p];
    x->table[n++] = &seed;
    /* the step's outputs, the gradients excluded: output 0 is the loss */
    for (int j = 0; j < x->entry->noutputs; j++) x->table[n++] = outs[j];
    if (n != x->entry->nbuffers) rc = fail(e, "the kernels' step takes %d buffers, the program passes %d", x->entry->nbuffers, n);
    else if (x->entry->fn(x->table) != 0)
      rc = fail(e, "stage %d, micro-batch %d: %s", x->stage, k, x->hctx.error ? x->hctx.error : "the step failed");
    total += outs[0][0];
  }
  for (int j = 0; outs && j < x->entry->noutputs; j++) free(outs[j]);
  free(outs);
  if (rc) return rc;
  if (tie_grads(x, 1, e) < 0) return -1;
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    if (!u->t || x->inplace[u->u->param]) continue;
    for (int64_t j = 0; j < u->numel; j++) u->t->grad[j] += u->fgrad[j];
  }
  *loss = total / (double)nmicro;
  return 0;
}

static int exec_step(void *self, TrainCtx *ctx, const DataBatch *const *micro, int nmicro, double *loss, int *has_loss, RtErr *e) {
  Exec *x = self;
  x->ctx = ctx;
  int rc = x->in ? step_interp(x, micro, nmicro, loss, e) : step_native(x, micro, nmicro, loss, e);
  if (rc == 0 && x->ring_head) rc = fail(e, "a context-parallel send that no receive paired with (the ring's transfers do not pair)");
  ring_clear(x);
  *has_loss = x->last;
  return rc;
}

static void exec_destroy(void *self) { exec_free(self); }

static const TrainProgram program = {TRAIN_PROGRAM_ABI, "hpdl-chunk", 0, exec_create, exec_step, exec_destroy};

__attribute__((visibility("default"))) const TrainProgram *hpdl_program_v1(void);
__attribute__((visibility("default"))) const TrainProgram *hpdl_program_v1(void) { return &program; }
