/* program_cuda.c - the program of a --target cuda artifact (program.h):
 * the stage's chunk (stageS.hir) walked by devexec on a device, the GPU
 * (device_cuda.c) or the emulated one (device_emu.c), with the launches and
 * fused graphs of stageS.kernels.json and the kernels of stageS.cubin
 * (stageS.ptx when the GPU is newer than the cubin's architecture) or
 * stageS.emu.so.
 *
 * Each step runs the micro-batches on the device (the step graph with seed
 * grad_scale, gradients accumulating there; under a pipeline the stage's
 * instruction list, each micro-batch in a forward and a backward half).
 * Where it can (resident: ZeRO 0-3 without compression, ZeRO sharding
 * them over dp) the parameters, gradients and the optimizer's moments stay
 * on the device and the loop asks this program for the gradient norm and
 * the update; otherwise each step copies the parameters in and the
 * gradients out and the loop reduces, clips and updates on the host. The
 * chunk's collectives, the pipeline's transfers and the data-parallel sums
 * of resident gradients go through NCCL on the
 * device's buffers where every rank has a GPU of its own and NCCL loads
 * (HPDL_COLLECTIVES=nccl|host forces either; the emulated device takes
 * NCCL only when forced), else through the loop's Comm (MPI) in host
 * memory; the tied parameters always through the latter. One GPU per local
 * rank; ranks beyond the GPUs share them (docs/gpu.md). */
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "schedule.h"
#include "comm_ring.h"
#include "devcomp.h"
#include "devexec.h"
#include "devoptim.h"
#include "extcall.h"
#include "program.h"
#include "program_cuda.h"
#include "program_ir.h"

typedef struct {
  TrainTensor *t;  /* the loop's tensor; NULL for a mirror */
  int param;
  int64_t layer, numel;
  const ProgramUse *u;
  float *mirror;   /* a tied copy another stage owns: its values, received each step */
} CudaUse;

enum { ENT_DENSE, ENT_EXPERT_WHOLE, ENT_EXPERT_SLICE };

/* ZeRO 3 with bf16 copies (precision = bf16): a layer's unit gathered as
 * the bf16 copies its GEMMs read, each member rounding its slice before
 * the all-gather (half the bytes of an fp32 gather, and no fp32 copy of
 * the unit's weights held), and in fp32 only the values some node reads
 * so (norms, biases): each member's packed, all-gathered, and unpacked in
 * the unit's order once the gather is done (HPDL_ZERO3_GATHER=fp32: the
 * whole unit in fp32, rounded after, as before). The same bits either way:
 * a rounding of the same fp32 values. */
typedef struct {
  int on;
  int64_t nme, nmax, n32; /* fp32 values: in this member's slice, the most in one member's, the unit's */
  int64_t *pack, *unpack; /* on the device: the slice's (its indices) and the unit's (into [dp, nmax]) */
  void *b16, *f32;        /* the gathered bf16 copies and fp32 values, while the unit is */
  void *stage, *gath;     /* sent (the slice's bf16 copies, then its packed fp32 values) and received, until unpacked */
} Unit16;

typedef struct {
  Device *dev;
  Arena *arena;
  ProgramChunk *pc;
  ExtCalls *ext; /* the module's extern libraries (kind "host" launches); NULL without */
  DevxProgram prog;
  DevExec *x;
  CudaUse *uses;
  int nuses;
  float *host; /* one copy's worth, the largest */
  int32_t **feeds;
  Comm *comm;
  Comm *dcomm;   /* NCCL on the device's buffers; NULL: the chunk's collectives through comm, in host memory */
  char coll[300]; /* the start-up line's word on the collectives */
  CommRing ring; /* context parallelism's sends not yet exchanged */
  RtErr cerr;
  /* resident: the parameters, gradients and the optimizer stay on the device */
  int resident;
  int *use_of; /* per loop tensor: its use */
  DevOptim *opt;
  /* resident on dp > 1 members with compression = bf16 | fp16: the
   * gradients' sums over dp compressed on the device (devcomp.h; NULL:
   * uncompressed), error feedback's residual of use u at comp_at[u] (ZeRO:
   * of flat value q at q) */
  DevComp *comp;
  int64_t *comp_at;
  char zwords[120];      /* the start-up line's words on them */
  unsigned char *zstage; /* their exchanges' staging in host memory (no NCCL) */
  size_t zstage_cap;
  double *sums;
  /* HPDL_PROFILE: seconds of the steps' phases (the device synchronised
   * between them), reported when the run ends */
  int timing;
  int launch_top; /* HPDL_PROFILE=N, N > 1: every launch timed alone from the second step, the N slowest reported */
  const TrainProfiler *pf; /* hpdlrun --profile; NULL off */
  long steps;
  /* pipeline stages (pp > 1): this rank's chunk and instruction list, the
   * micro-batch running (the transfers' tags), the frames in flight, and
   * the sends not yet completed */
  int pp, stage, nmicro, cur_mb;
  int chunk, nchunks; /* this program's chunk of the model's line of chunks (virtual stages: a stage runs several) */
  int borrowed;       /* the device, NCCL and the pipeline's stream are the stage's first chunk's */
  int last_bwd;       /* the stage's instruction list: this chunk's last backward */
  DevxFrame **frames;
  CommOutbox outbox;
  double t_params, t_inputs, t_micro, t_grads;
  /* overlap (resident, dp > 1, NCCL): each gradient's data-parallel sum
   * queued on cstream as the last micro-batch's backward finishes it
   * (devx_set_grad_ready), in buckets of bucket_cap bytes */
  void *cstream;
  void *pstream; /* NCCL: the pipeline's sends and receives */
  void *ringstream; /* NCCL: context parallelism's ring, each block's transfer under the attention before it */
  int *use_at;        /* per parameter copy (devx_copy_index): its use, or -1 */
  unsigned char *reduced; /* per use: its sum queued (or bucketed) this step */
  int *bucket, nbucket;
  size_t bucket_bytes, bucket_cap;
  /* resident under ZeRO (ctx->shards; "ZeRO on the device" below):
   * devexec's blocks (zlen values) in units, each split evenly over dp;
   * this member's parts, zown values in all, kept in ranges (unit u's at
   * zoff[u]): the moments (zm, zv), at ZeRO 2 and 3 the reduced gradients
   * (zg, zt), at ZeRO 3 the parameters (zp) */
  int zero, dp, dprank;
  int64_t zlen, zown;
  void *zm, *zv;
  int nunits;
  const int64_t *ustart; /* devx_units */
  int64_t *zoff;         /* per unit: its owned values' place in the ranges */
  void *zp, *zg;         /* ZeRO 3: the owned parameters and reduced gradients */
  void **ubuf;           /* ZeRO 3, per unit: gathered for the step's layers, or NULL */
  int *uref;
  Unit16 *u16;           /* ZeRO 3 with bf16 copies, per unit: its gather in bf16 (NULL: none) */
  /* overlap (NCCL): per unit, its gradient copies not final yet this step,
   * whether it holds a tied copy (reduced after the step), and whether its
   * reduce-scatter started */
  int *uleft, *uleft0;
  unsigned char *ulate, *ureduced;
  long uearly, uall; /* unit reductions started by the hook, and all (HPDL_PROFILE) */
  /* ZeRO 2 and 3: the gradients' block is freed; each unit's gradients get
   * a pool buffer for its layer's backward (unit 0 for the whole step),
   * reduce-scattered into zt's slice as the layer ends (on rstream with
   * NCCL) and then added into zg; a closed unit's buffer waits in retired
   * until the launches have waited for its reduce-scatter */
  void *zt, *rstream;
  void **ugrad;
  int *ugref;
  unsigned char *uadd; /* per unit: zt holds a sum not yet added into zg */
  void **retired;
  size_t *retired_bytes;
  int nretired;
  TrainCtx *tctx;        /* the running step's (the layer hook's collectives) */
  int *ent_tensor; /* per optimizer entry (an owned slice of a tensor): the loop's tensor */
  /* ZeRO: per entry, ENT_EXPERT_WHOLE a whole expert tensor (kept apart, not
   * sharded over dp), ENT_EXPERT_SLICE this member's slice of one (xsliced),
   * else ENT_DENSE */
  unsigned char *ent_expert;
  int64_t *ent_at, *ent_n; /* ENT_EXPERT_SLICE: the slice's place in the loop's expert slice ([own2_lo, ...)) and length */
  int msize;      /* bytes of a moment value in zm, zv: 4, or 2 under train.moments = bf16 */
  int xsliced;     /* the experts' moments sharded over edp as the loop's (Megatron's distributed optimizer); HPDL_EXPERT_STATE=whole: not */
  int nent;
  float *zhost;    /* host staging: zlen + zown values (host collectives, checkpoints) */
} CudaProg;

/* A pipeline stage's programs: its chunk, or with virtual stages its v
 * chunks (chunk c runs on stage c mod pp), in ascending order; c[0] owns
 * the device, NCCL and the pipeline's stream. */
enum { MAX_STAGE_CHUNKS = 64 };
typedef struct {
  CudaProg *c[MAX_STAGE_CHUNKS];
  int n;
  int pp, stage, nchunks, v;
  SchedInstr *ins; /* the stage's instruction list for ins_m micro-batches */
  int nins, ins_m;
  int *chunk_of; /* resident with several chunks: per loop tensor, the chunk holding it */
} CudaStage;

static CudaProg *held(const CudaStage *S, int chunk) {
  for (int i = 0; i < S->n; i++)
    if (S->c[i]->chunk == chunk) return S->c[i];
  return NULL;
}

/* ---- the chunk's collectives: NCCL on the device's buffers (dcomm), or
 * the loop's Comm in host memory ---- */

static Comm *chunk_comm(const CudaProg *P) { return P->dcomm ? P->dcomm : P->comm; }

static int hc_all_reduce(void *ctx, int group, int op, float *buf, int64_t n, char *err, size_t errlen) {
  CudaProg *P = ctx;
  Comm *c = chunk_comm(P);
  if (c->ops->all_reduce(c, comm_group_of_ir(group), COMM_F32, op ? COMM_MAX : COMM_SUM, buf, n, &P->cerr) == 0) return 0;
  snprintf(err, errlen, "%s", P->cerr.msg);
  return -1;
}

static int hc_all_to_all(void *ctx, int group, const float *in, int64_t n, float *out, char *err, size_t errlen) {
  CudaProg *P = ctx;
  Comm *c = chunk_comm(P);
  if (c->ops->all_to_all(c, comm_group_of_ir(group), COMM_F32, in, n, out, &P->cerr) == 0) return 0;
  snprintf(err, errlen, "%s", P->cerr.msg);
  return -1;
}

static int hc_all_gather(void *ctx, int group, const float *in, int64_t n, float *out, char *err, size_t errlen) {
  CudaProg *P = ctx;
  Comm *c = chunk_comm(P);
  if (c->ops->all_gather(c, comm_group_of_ir(group), COMM_F32, in, n, out, &P->cerr) == 0) return 0;
  snprintf(err, errlen, "%s", P->cerr.msg);
  return -1;
}

static int hc_reduce_scatter(void *ctx, int group, const float *in, int64_t n, float *out, char *err, size_t errlen) {
  CudaProg *P = ctx;
  Comm *c = chunk_comm(P);
  if (c->ops->reduce_scatter(c, comm_group_of_ir(group), COMM_F32, COMM_SUM, in, n, out, &P->cerr) == 0) return 0;
  snprintf(err, errlen, "%s", P->cerr.msg);
  return -1;
}

/* A pipeline transfer's peer stage and tag, or -1 with the reason in err:
 * chunks form a line, chunk c on stage c mod pp (with one chunk a stage,
 * chunk = stage), and the tag names the sending chunk's (chunk,
 * micro-batch) as the CPU program's do. */
static int pipe_peer(CudaProg *P, int offset, int sending, int *tag, char *err, size_t errlen) {
  int c = P->chunk + offset;
  if (c < 0 || c >= P->nchunks) {
    snprintf(err, errlen, "chunk %d: a transfer to chunk %d, which does not exist", P->chunk, c);
    return -1;
  }
  *tag = comm_pipe_tag(P->chunk, P->nmicro, P->cur_mb, offset, sending);
  if (*tag < 0) {
    snprintf(err, errlen, "%d micro-batches over %d chunks need more message tags than MPI promises", P->nmicro, P->nchunks);
    return -1;
  }
  return c % P->pp;
}

static int hc_send(void *ctx, int group, int offset, const float *buf, int64_t n, char *err, size_t errlen) {
  CudaProg *P = ctx;
  if (group == IRG_PP) {
    /* out of a buffer of its own, not waiting for the receive (a 1F1B
     * stage sends an activation while its neighbour sends a gradient
     * back); every send completes at the end of the step */
    int tag, peer = pipe_peer(P, offset, 1, &tag, err, errlen);
    if (peer < 0) return -1;
    size_t bytes = sizeof(float) * (size_t)n;
    float *copy = comm_outbox_buffer(&P->outbox, bytes);
    if (!copy) return snprintf(err, errlen, "out of memory for a pipeline message of %" PRId64 " values", n), -1;
    if (!P->dcomm) memcpy(copy, buf, bytes);
    else if (P->dev->ops->copy(P->dev, copy, buf, bytes))
      return snprintf(err, errlen, "a pipeline message: %s", dev_error(P->dev)), -1;
    Comm *c = chunk_comm(P);
    if (c->ops->isend(c, COMM_PP, COMM_F32, copy, n, peer, tag, &P->cerr) == 0) return 0;
  } else if (group == IRG_CP) {
    if (comm_ring_send(&P->ring, chunk_comm(P), COMM_F32, buf, n, offset, COMM_TAG_RING, &P->cerr) == 0) return 0;
  } else {
    snprintf(err, errlen, "a transfer over the %s group, which has no neighbours", ir_group_name((IrGroup)group));
    return -1;
  }
  snprintf(err, errlen, "%s", P->cerr.msg);
  return -1;
}

static int hc_recv(void *ctx, int group, int offset, float *buf, int64_t n, char *err, size_t errlen) {
  CudaProg *P = ctx;
  if (group == IRG_PP) {
    int tag, peer = pipe_peer(P, offset, 0, &tag, err, errlen);
    if (peer < 0) return -1;
    if (chunk_comm(P)->ops->recv(chunk_comm(P), COMM_PP, COMM_F32, buf, n, peer, tag, &P->cerr) == 0) return 0;
  } else if (group != IRG_CP) {
    snprintf(err, errlen, "a transfer over the %s group, which has no neighbours", ir_group_name((IrGroup)group));
    return -1;
  } else if (comm_ring_recv(&P->ring, chunk_comm(P), COMM_F32, buf, n, offset, COMM_TAG_RING, &P->cerr) == 0)
    return 0;
  snprintf(err, errlen, "%s", P->cerr.msg);
  return -1;
}

/* This process's index among the job's ranks on its node: the launcher's
 * word for it (Open MPI, SLURM, MPICH / Intel MPI, PMIx), else the world
 * rank modulo the node's ranks (mpirun fills a node's slots in order). */
static int local_rank_of(const Comm *c) {
  const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMIX_LOCAL_RANK",
                        "PMI_LOCAL_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return c->node_ranks > 0 ? c->world_rank % c->node_ranks : 0;
}

static int fail(RtErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(RtErr *e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return -1;
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  size_t cap = 0, len = 0, got;
  do {
    if (len == cap) {
      cap = cap ? 2 * cap : 1 << 20;
      unsigned char *b = realloc(buf, cap + 1);
      if (!b) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = b;
    }
    got = fread(buf + len, 1, cap - len, f);
    len += got;
  } while (got > 0);
  fclose(f);
  buf[len] = 0;
  *n = len;
  return buf;
}

/* Puts "what: " before the message already in e. */
static int prefix(RtErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int prefix(RtErr *e, const char *fmt, ...) {
  char tail[RT_ERR_LEN], head[512];
  memcpy(tail, e->msg, sizeof tail);
  tail[sizeof tail - 1] = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  int n = snprintf(e->msg, sizeof e->msg, "%s: %s", head, tail);
  (void)n; /* one longer than the message loses its end */
  return -1;
}

static int *ints(json_t *a, int *n) {
  *n = (int)json_array_size(a);
  int *v = calloc((size_t)*n + 1, sizeof(int));
  for (int i = 0; v && i < *n; i++) v[i] = (int)json_integer_value(json_array_get(a, (size_t)i));
  return v;
}

static int64_t jint(json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }

/* stageS.kernels.json -> the host program; checked against the module. */
static int load_kernels(CudaProg *P, const char *path, RtErr *e) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) return fail(e, "%s:%d: %s", path, je.line, je.text);
  const IrModule *m = P->pc->m;
  json_t *gs = json_object_get(root, "graphs"), *ls = json_object_get(root, "launches");
  int rc = 0;
  if (!json_is_array(gs) || !json_is_array(ls))
    rc = fail(e, "%s: no \"graphs\" or \"launches\" (an artifact of an older hpdlc: recompile it)", path);
  else if ((int)json_array_size(gs) != m->ngraphs)
    rc = fail(e, "%s: %zu graphs, the module has %d (recompile the artifact)", path, json_array_size(gs), m->ngraphs);
  DevxProgram *p = &P->prog;
  p->m = m;
  p->ngraphs = rc ? 0 : m->ngraphs;
  p->graphs = calloc((size_t)m->ngraphs + 1, sizeof(DevxGraph));
  for (int g = 0; g < p->ngraphs && !rc; g++) {
    json_t *ks = json_object_get(json_array_get(gs, (size_t)g), "kernels");
    DevxGraph *G = &p->graphs[g];
    G->nkernels = (int)json_array_size(ks);
    json_t *cut = json_object_get(json_array_get(gs, (size_t)g), "cut");
    G->cut = json_is_integer(cut) ? (int)json_integer_value(cut) : -1;
    if (G->cut >= G->nkernels) rc = fail(e, "%s: graph %d: cut %d beyond its %d kernels", path, g, G->cut, G->nkernels);
    G->kernels = calloc((size_t)G->nkernels + 1, sizeof(DevxKernel));
    for (int k = 0; k < G->nkernels && !rc; k++) {
      json_t *jk = json_array_get(ks, (size_t)k);
      DevxKernel *K = &G->kernels[k];
      const char *kind = json_string_value(json_object_get(jk, "kind"));
      K->kind = !kind ? DEVX_RUN : !strcmp(kind, "view") ? DEVX_VIEW : !strcmp(kind, "leaf") ? DEVX_LEAF
              : !strcmp(kind, "call") ? DEVX_CALL : !strcmp(kind, "comm") ? DEVX_COMM : DEVX_RUN;
      K->inputs = ints(json_object_get(jk, "inputs"), &K->ninputs);
      K->outputs = ints(json_object_get(jk, "outputs"), &K->noutputs);
      K->nodes = ints(json_object_get(jk, "nodes"), &K->nnodes);
      json_t *aux = json_object_get(jk, "aux_node");
      K->aux_node = json_is_integer(aux) ? (int)json_integer_value(aux) : -1;
      K->launches = calloc(8, sizeof(DevxLaunch));
      const IrGraph *ig = m->graphs[g];
      for (int i = 0; i < K->ninputs + K->noutputs; i++) {
        int v = i < K->ninputs ? K->inputs[i] : K->outputs[i - K->ninputs];
        if (v < 0 || v >= ig->nnodes) rc = fail(e, "%s: graph %d kernel %d: value %d out of range", path, g, k, v);
      }
      for (int i = 0; i < K->nnodes && !rc; i++)
        if (K->nodes[i] < 0 || K->nodes[i] >= ig->nnodes) rc = fail(e, "%s: graph %d kernel %d: node out of range", path, g, k);
      if (K->kind != DEVX_RUN && K->nnodes < 1) rc = fail(e, "%s: graph %d kernel %d: no nodes", path, g, k);
      if (!rc && aux && (K->aux_node < 0 || K->aux_node >= ig->nnodes || ig->nodes[K->aux_node].op != IR_AUX_LOSS))
        rc = fail(e, "%s: graph %d kernel %d: aux_node is not an aux_loss of the graph", path, g, k);
    }
  }
  for (size_t i = 0; i < json_array_size(ls) && !rc; i++) {
    json_t *jl = json_array_get(ls, i);
    int g = (int)jint(jl, "graph_index"), k = (int)jint(jl, "kernel");
    if (g < 0 || g >= p->ngraphs || k < 0 || k >= p->graphs[g].nkernels) {
      rc = fail(e, "%s: launch %zu: graph %d kernel %d is not in the module", path, i, g, k);
      break;
    }
    DevxKernel *K = &p->graphs[g].kernels[k];
    if (K->nlaunches && K->nlaunches % 8 == 0) K->launches = realloc(K->launches, sizeof(DevxLaunch) * (size_t)(K->nlaunches + 8));
    DevxLaunch *L = &K->launches[K->nlaunches++];
    memset(L, 0, sizeof *L);
    const char *name = json_string_value(json_object_get(jl, "name")), *kind = json_string_value(json_object_get(jl, "kind"));
    L->name = strdup(name ? name : "?");
    snprintf(L->kind, sizeof L->kind, "%s", kind ? kind : "?");
    L->grid = (unsigned)jint(jl, "grid");
    L->block = (unsigned)jint(jl, "block");
    L->flops = json_number_value(json_object_get(jl, "flops"));
    L->bytes = json_number_value(json_object_get(jl, "bytes"));
    json_t *host = json_object_get(jl, "host");
    if (host) {
      json_t *hio = json_object_get(host, "io");
      L->is_host = 1;
      L->host_extern = (int)json_integer_value(json_object_get(host, "extern"));
      L->host_grad = json_is_true(json_object_get(host, "grad"));
      L->nhost_io = (int)json_array_size(hio);
      if (L->nhost_io < 2 || L->nhost_io > (int)(sizeof L->host_io / sizeof L->host_io[0])) {
        rc = fail(e, "%s: launch %s: a host call of %d buffers", path, L->name, L->nhost_io);
        break;
      }
      for (int h = 0; h < L->nhost_io && !rc; h++) {
        L->host_io[h] = (int)json_integer_value(json_array_get(hio, (size_t)h));
        if (L->host_io[h] < 0 || L->host_io[h] >= K->ninputs + K->noutputs)
          rc = fail(e, "%s: launch %s: host buffer %d is not one of the kernel's", path, L->name, L->host_io[h]);
      }
      if (!rc && (L->host_extern < 0 || L->host_extern >= P->pc->m->nexterns))
        rc = fail(e, "%s: launch %s: extern %d is not one of the module's %d", path, L->name, L->host_extern,
                  P->pc->m->nexterns);
    }
    json_t *gm = json_object_get(jl, "gemm"), *gr = json_object_get(jl, "grouped");
    if (!gm) continue;
    L->is_gemm = 1;
    if (gr) { /* a GEMM an expert over its rows (devexec.c's grouped_run) */
      L->grouped = (int)jint(gr, "kind");
      L->grouped_ids = (int)jint(gr, "ids");
      L->experts = jint(gr, "experts");
      if ((L->grouped != 1 && L->grouped != 2) || L->grouped_ids < 0 || L->grouped_ids >= K->ninputs || L->experts < 1)
        rc = fail(e, "%s: launch %zu (%s): a grouped GEMM of kind %d, ids %d, %lld experts", path, i, L->name, L->grouped,
                  L->grouped_ids, (long long)L->experts);
    }
    DevGemm *d = &L->gemm;
    d->a = (int)jint(gm, "a");
    d->b = (int)jint(gm, "b");
    d->c = (int)jint(gm, "c");
    d->trans_a = json_is_true(json_object_get(gm, "trans_a"));
    d->trans_b = json_is_true(json_object_get(gm, "trans_b"));
    const char *abt = json_string_value(json_object_get(gm, "ab_type"));
    d->ab_bf16 = abt && !strcmp(abt, "bf16");
    if (abt && !d->ab_bf16) rc = fail(e, "%s: launch %s: GEMM operands of type %s (this runtime knows bf16)", path, L->name, abt);
    const char *ct = json_string_value(json_object_get(gm, "c_type"));
    d->c_bf16 = ct && !strcmp(ct, "bf16");
    if (ct && !d->c_bf16) rc = fail(e, "%s: launch %s: a GEMM output of type %s (this runtime knows bf16)", path, L->name, ct);
    d->m = jint(gm, "m");
    d->n = jint(gm, "n");
    d->k = jint(gm, "k");
    d->lda = jint(gm, "lda");
    d->ldb = jint(gm, "ldb");
    d->ldc = jint(gm, "ldc");
    d->alpha = json_number_value(json_object_get(gm, "alpha"));
    d->batch = jint(gm, "batch");
    d->stride_a = jint(gm, "stride_a");
    d->stride_b = jint(gm, "stride_b");
    d->stride_c = jint(gm, "stride_c");
    d->bias = d->aux = -1;
    json_t *ba = json_object_get(gm, "batch_axes");
    if (ba) {
      json_t *dims = json_object_get(ba, "dims");
      d->batch_axes = (int)json_array_size(dims);
      if (d->batch_axes > DEV_MAX_BATCH_AXES) rc = fail(e, "%s: launch %zu: too many batch axes", path, i);
      for (int q = 0; q < d->batch_axes && !rc; q++) {
        d->bdims[q] = json_integer_value(json_array_get(dims, (size_t)q));
        d->sa[q] = json_integer_value(json_array_get(json_object_get(ba, "stride_a"), (size_t)q));
        d->sb[q] = json_integer_value(json_array_get(json_object_get(ba, "stride_b"), (size_t)q));
      }
      d->amat = jint(ba, "matrix_a");
      d->bmat = jint(ba, "matrix_b");
    }
    json_t *ep = json_object_get(gm, "epilogue");
    if (ep) {
      const char *ek = json_string_value(json_object_get(ep, "kind"));
      int ekind = dev_epilogue_of(ek);
      if (ekind < 0) rc = fail(e, "%s: launch %zu (%s): unknown GEMM epilogue '%s'", path, i, L->name, ek);
      else d->epilogue = (DevEpilogue)ekind;
      d->bias = (int)jint(ep, "bias");
      d->aux = (int)jint(ep, "aux");
    }
    int nio = K->ninputs + K->noutputs;
    if (d->a < 0 || d->a >= nio || d->b < 0 || d->b >= nio || d->c < 0 || d->c >= nio || d->bias >= nio || d->aux >= nio ||
        (d->epilogue != DEV_EPI_NONE && d->bias < 0))
      rc = fail(e, "%s: launch %zu (%s): an operand index outside the kernel's %d values", path, i, L->name, nio);
    if (d->c_bf16 && ((d->epilogue != DEV_EPI_BIAS && d->epilogue != DEV_EPI_NONE) || d->aux >= 0 || !d->ab_bf16))
      rc = fail(e, "%s: launch %zu (%s): a bf16 GEMM output without bf16 operands, or with an epilogue other than a bias", path, i,
                L->name);
    if ((d->epilogue == DEV_EPI_BGRAD_A || d->epilogue == DEV_EPI_BGRAD_B) && (d->batch > 1 || d->aux >= 0))
      rc = fail(e, "%s: launch %zu (%s): a bias-gradient epilogue of a batch of matrices or with an aux output", path, i,
                L->name);
  }
  json_decref(root);
  return rc;
}

static TrainTensor *find_tensor(TrainCtx *ctx, const char *name, int64_t layer) {
  for (int i = 0; i < ctx->ntensors; i++)
    if (ctx->tensors[i].layer == layer && !strcmp(ctx->tensors[i].param->name, name)) return &ctx->tensors[i];
  return NULL;
}

static void unit_release(CudaProg *P, int u);
static void gather16_free(CudaProg *P);

/* A chunk's program; the device, NCCL and the pipeline's stream stay when
 * they are borrowed (the stage's first chunk closes them, last). */
static void chunk_destroy(CudaProg *P) {
  if (!P) return;
  devopt_free(P->opt); /* its buffers are the device's: before the device closes */
  devz_free(P->comp);
  free(P->comp_at);
  free(P->zstage);
  if (P->zm) P->dev->ops->release(P->dev, P->zm);
  if (P->zv) P->dev->ops->release(P->dev, P->zv);
  if (P->zp) P->dev->ops->release(P->dev, P->zp);
  if (P->zg) P->dev->ops->release(P->dev, P->zg);
  if (P->zt) P->dev->ops->release(P->dev, P->zt);
  for (int u = 0; P->ubuf && u < P->nunits; u++) unit_release(P, u);
  gather16_free(P);
  for (int u = 0; P->ugrad && u < P->nunits; u++)
    if (P->ugrad[u]) devx_buffer_put(P->x, P->ugrad[u], sizeof(float) * (size_t)(P->ustart[u + 1] - P->ustart[u] + 1));
  for (int i = 0; i < P->nretired; i++) devx_buffer_put(P->x, P->retired[i], P->retired_bytes[i]);
  if (P->rstream) P->dev->ops->stream_destroy(P->dev, P->rstream);
  free(P->zoff);
  free(P->ubuf);
  free(P->uref);
  free(P->uleft);
  free(P->uleft0);
  free(P->ugrad);
  free(P->ugref);
  free(P->uadd);
  free(P->retired);
  free(P->retired_bytes);
  free(P->ulate);
  free(P->ureduced);
  free(P->ent_tensor);
  free(P->ent_expert);
  free(P->ent_at);
  free(P->ent_n);
  free(P->zhost);
  for (int i = 0; P->frames && i < P->nmicro; i++) devx_frame_drop(P->x, P->frames[i]); /* their buffers are the pool's */
  comm_ring_clear(&P->ring); /* the messages' buffers too, with NCCL */
  comm_outbox_free(&P->outbox);
  if (P->cstream) P->dev->ops->stream_destroy(P->dev, P->cstream);
  if (P->pstream && !P->borrowed) P->dev->ops->stream_destroy(P->dev, P->pstream);
  if (P->ringstream && !P->borrowed) P->dev->ops->stream_destroy(P->dev, P->ringstream);
  free(P->use_at);
  free(P->reduced);
  free(P->bucket);
  if (!P->borrowed) comm_destroy(P->dcomm); /* while the device's context lives */
  devx_free(P->x);
  devx_program_free(&P->prog);
  free(P->use_of);
  free(P->sums);
  free(P->frames);
  for (int i = 0; P->uses && i < P->nuses; i++) free(P->uses[i].mirror);
  if (P->dev && !P->borrowed) P->dev->ops->close(P->dev);
  if (P->ext) extcall_close(P->ext);
  for (int i = 0; P->feeds && P->pc && i < P->pc->m->ninputs; i++) free(P->feeds[i]);
  free(P->feeds);
  free(P->uses);
  free(P->host);
  if (P->arena) arena_free(P->arena);
  free(P);
}

/* hpdlrun --profile: a launch's span ends now (the device drained after it) */
static void cuda_launch_span(void *user, int graph, int64_t layer, const DevxLaunch *L, double secs, double flops) {
  CudaProg *P = user;
  double t1 = P->pf->now(P->pf->self);
  (void)graph;
  int compute = L->is_gemm || !strcmp(L->kind, "attention") || !strcmp(L->kind, "conv"); /* priced with the GEMMs */
  P->pf->span(P->pf->self, L->name ? L->name : "?", compute ? "gemm" : "kernel", t1 - secs, t1, P->cur_mb, P->pc->chunk,
              P->prog.m->graphs[graph]->count > 1 ? layer : -1, 0, flops);
}

/* extern calls from the device program: on its host copies, through core/extcall.h */
static int host_extern(void *user, int index, int grad, void *const *bufs, char *err, size_t errlen) {
  CudaProg *P = user;
  return grad ? extcall_grad(P->ext, index, bufs, err, errlen) : extcall_forward(P->ext, index, bufs, err, errlen);
}

/* The extern libraries, loaded at set-up as the CPU program loads them (program_exec.c). */
static int externs_open(CudaProg *P, const Artifact *a, RtErr *e) {
  IrModule *m = P->pc->m;
  if (!m->nexterns) return 0;
  char why[2048];
  if (!(P->ext = extcall_open_artifact(m->externs, m->nexterns, a->dir, P->arena, why, sizeof why))) return fail(e, "%s", why);
  DevxHost h = {P, host_extern};
  devx_set_host(P->x, &h);
  return 0;
}

static int dev_copy_cb(void *ctx, void *dst, const void *src, size_t bytes) {
  Device *d = ctx;
  return d->ops->copy(d, dst, src, bytes);
}

static int dev_wait_cb(void *ctx, void *waiter, void *waited) {
  Device *d = ctx;
  return d->ops->stream_wait ? d->ops->stream_wait(d, waiter, waited) : 0;
}

static void *msg_alloc(void *ctx, size_t bytes) { return devx_buffer(((CudaProg *)ctx)->x, bytes); }
static void msg_release(void *ctx, void *p, size_t bytes) { devx_buffer_put(((CudaProg *)ctx)->x, p, bytes); }
static int msg_copy(void *ctx, void *dst, const void *src, size_t bytes) { return dev_copy_cb(((CudaProg *)ctx)->dev, dst, src, bytes); }

/* NCCL or MPI through host memory for the chunk's collectives, the
 * pipeline's transfers and the data-parallel sum; every rank the same
 * (a rank that cannot use NCCL makes them all use MPI). HPDL_COLLECTIVES:
 * "nccl" (an error where it cannot run), "host", or unset: NCCL where the
 * device is a GPU of the rank's own and the library loads. */
static int choose_collectives(CudaProg *P, TrainCtx *ctx, const char *kind, RtErr *e) {
  Comm *host = ctx->comm;
  P->coll[0] = '\0';
  if (host->world_size <= 1) return 0;
  const char *mode = getenv("HPDL_COLLECTIVES");
  if (mode && *mode && strcmp(mode, "nccl") && strcmp(mode, "host"))
    return fail(e, "HPDL_COLLECTIVES=%s: expected nccl (NCCL on the devices' buffers) or host (MPI through host memory)", mode);
  int forced = mode && !strcmp(mode, "nccl");
  char why[2400] = "";
  if (mode && !strcmp(mode, "host")) snprintf(why, sizeof why, "HPDL_COLLECTIVES=host");
  else if (!forced && strcmp(kind, "cuda")) snprintf(why, sizeof why, "the emulated device; HPDL_COLLECTIVES=nccl to use NCCL");
  else if (!forced && host->node_ranks > P->dev->ngpus)
    snprintf(why, sizeof why, "%d ranks on a node of %d GPU%s: NCCL needs a GPU a rank", host->node_ranks, P->dev->ngpus,
             P->dev->ngpus == 1 ? "" : "s");
  else if (!forced) {
    char tried[2048] = "";
    void *lib = dev_nccl_open(tried, sizeof tried);
    if (!lib) snprintf(why, sizeof why, "no NCCL: could not open %s", tried);
  }
  /* all ranks agree: one that cannot makes every rank use MPI */
  int32_t cannot = why[0] != '\0';
  RtErr he;
  if (host->ops->all_reduce(host, COMM_WORLD, COMM_I32, COMM_MAX, &cannot, 1, &he)) return fail(e, "%s", he.msg);
  if (cannot && !why[0]) snprintf(why, sizeof why, "another rank cannot use NCCL");
  if (!cannot) {
    CommDevCopy cp = {P->dev, dev_copy_cb, dev_wait_cb};
    RtErr ne;
    if (!(P->dcomm = comm_nccl_new(host, &cp, &ne))) return fail(e, "collectives over NCCL: %s", ne.msg);
    P->ring.mem = P->outbox.mem = (CommMem){P, msg_alloc, msg_release, msg_copy};
    /* the pipeline's transfers on a stream of their own: a send does not hold up the next computation */
    if (P->pp > 1 && P->dev->ops->stream_create && !(P->pstream = P->dev->ops->stream_create(P->dev)))
      return fail(e, "a stream for the pipeline's transfers: %s", dev_error(P->dev));
    comm_nccl_set_group_stream(P->dcomm, COMM_PP, P->pstream);
    /* the context group's ring on one more: comm_ring.c starts a block's exchange at its send */
    if (host->size[COMM_CP] > 1 && P->dev->ops->stream_create && !(P->ringstream = P->dev->ops->stream_create(P->dev)))
      return fail(e, "a stream for the context ring's transfers: %s", dev_error(P->dev));
    comm_nccl_set_group_stream(P->dcomm, COMM_CP, P->ringstream);
    snprintf(P->coll, sizeof P->coll, "; collectives: NCCL %s on the device's buffers", comm_nccl_version(P->dcomm));
    return 0;
  }
  if (forced) return fail(e, "HPDL_COLLECTIVES=nccl, but %s", why);
  snprintf(P->coll, sizeof P->coll, "; collectives: MPI through host memory (%.200s)", why);
  return 0;
}

/* One chunk's program: its module (mod) and kernels (ker), files of the
 * artifact; the stage's later chunks (first: its first) share its device,
 * its NCCL communicators and its pipeline stream. */
static CudaProg *chunk_create(TrainCtx *ctx, const char *mod, const char *ker, CudaProg *first, RtErr *e) {
  const Artifact *a = ctx->art;
  CudaProg *P = calloc(1, sizeof *P);
  if (!P) return fail(e, "out of memory"), NULL;
  P->arena = arena_new();
  P->comm = ctx->comm;
  int me = ctx->comm->world_rank;
  char mpath[4096], kpath[4096], err[1024] = "";
  snprintf(mpath, sizeof mpath, "%s/%s", a->dir, mod);
  snprintf(kpath, sizeof kpath, "%s/%s", a->dir, ker);
  P->pc = program_ir_read(P->arena, mpath, err, sizeof err);
  if (!P->pc) {
    fail(e, "%s", err);
    chunk_destroy(P);
    return NULL;
  }
  if (load_kernels(P, kpath, e)) {
    chunk_destroy(P);
    return NULL;
  }
  P->pp = (int)a->layout.pp;
  P->stage = ctx->comm->coords.pp;
  P->chunk = P->pc->chunk;
  P->nchunks = P->pc->nchunks > 0 ? P->pc->nchunks : 1;
  if (P->pp > 1 && (P->chunk % P->pp != P->stage || P->nchunks % P->pp)) {
    fail(e, "%s: chunk %d of %d on pipeline stage %d of %d (recompile the artifact)", mpath, P->chunk, P->nchunks, P->stage, P->pp);
    chunk_destroy(P);
    return NULL;
  }
  /* the device, then its module */
  const char *kind = ctx->device && *ctx->device ? ctx->device : "cuda";
  int local = local_rank_of(ctx->comm);
  if (first) {
    P->dev = first->dev;
    P->borrowed = 1;
  } else
    P->dev = dev_open(kind, DEV_ORDINAL_OF_LOCAL_RANK(local), err, sizeof err);
  if (!P->dev) {
    fail(e, "%s%s", err,
         strcmp(kind, "cuda") ? "" : "; without a GPU, `hpdlrun --device emulate` runs the artifact's kernels on the CPU (compile it with --emulate)");
    chunk_destroy(P);
    return NULL;
  }
  char base[4096];
  snprintf(base, sizeof base, "%s", kpath);
  char *dot = strstr(base, ".kernels.json");
  if (dot) *dot = '\0';
  char img[4200];
  if (!strcmp(kind, "emulate")) {
    snprintf(img, sizeof img, "%s.emu.so", base);
    if (P->dev->ops->load(P->dev, NULL, 0, img)) {
      fail(e, "%s (compile the artifact with --emulate for --device emulate)", dev_error(P->dev));
      chunk_destroy(P);
      return NULL;
    }
  } else {
    size_t n = 0;
    snprintf(img, sizeof img, "%s.cubin", base);
    unsigned char *cubin = read_all(img, &n);
    int rc = cubin ? P->dev->ops->load(P->dev, cubin, n, img) : -1;
    free(cubin);
    if (rc) { /* a newer GPU than the cubin's: the driver compiles the PTX */
      char why[1024];
      snprintf(why, sizeof why, "%s", cubin ? dev_error(P->dev) : "cannot read it");
      snprintf(img, sizeof img, "%s.ptx", base);
      unsigned char *ptx = read_all(img, &n);
      if (!ptx || P->dev->ops->load(P->dev, ptx, n + 1, img)) {
        fail(e, "%s.cubin: %s; and %s: %s", base, why, img, ptx ? dev_error(P->dev) : "cannot read it");
        free(ptx);
        chunk_destroy(P);
        return NULL;
      }
      free(ptx);
    }
  }
  /* the blocks' units padded to 16 x dp values: ZeRO's even split, by layer
   * (zero_setup: ZeRO 3 gathers them one by one, and each is reduced as
   * soon as the backward is done with it) */
  /* experts apart where dp members hold different ones (ep > 1: the loop's
   * pools then keep them in a region of their own, owned over edp); with
   * ep 1 they are dense parameters like the others */
  int zero_units = a->zero >= 1 && ctx->comm->size[COMM_DP] > 1;
  DevxFlat flat = {16 * (int64_t)ctx->comm->size[COMM_DP], zero_units, zero_units && ctx->comm->size[COMM_EP] > 1,
                   zero_units && a->zero >= 3};
  P->x = devx_new(P->dev, &P->prog, (unsigned long long)a->seed, &flat, err, sizeof err);
  if (!P->x || externs_open(P, a, e)) {
    if (!P->x) fail(e, "%s", err);
    chunk_destroy(P);
    return NULL;
  }
  if (first) { /* the first chunk's: one communicator a group, one stream for the transfers */
    P->dcomm = first->dcomm;
    P->pstream = first->pstream;
    P->ringstream = first->ringstream;
    snprintf(P->coll, sizeof P->coll, "%s", first->coll);
    if (P->dcomm) P->ring.mem = P->outbox.mem = (CommMem){P, msg_alloc, msg_release, msg_copy};
  } else if (choose_collectives(P, ctx, kind, e)) {
    chunk_destroy(P);
    return NULL;
  }
  DevxComm dc;
  memset(&dc, 0, sizeof dc);
  dc.device_buffers = P->dcomm != NULL;
  dc.reduce_scatter = hc_reduce_scatter;
  for (int g = 0; g < IRG_COUNT; g++) {
    dc.rank[g] = ctx->comm->rank[comm_group_of_ir(g)];
    dc.size[g] = ctx->comm->size[comm_group_of_ir(g)];
  }
  dc.ctx = P;
  dc.all_reduce = hc_all_reduce;
  dc.all_gather = hc_all_gather;
  dc.all_to_all = hc_all_to_all;
  dc.send = hc_send;
  dc.recv = hc_recv;
  devx_set_comm(P->x, &dc);
  if ((P->pf = ctx->prof)) {
    DevxTracer tr = {P, cuda_launch_span};
    devx_set_tracer(P->x, &tr);
  }
  /* the parameters the chunk reads and the loop's tensors */
  const IrModule *m = P->pc->m;
  P->uses = calloc((size_t)P->pc->nuses + 1, sizeof(CudaUse));
  int64_t largest = 1;
  for (int i = 0; i < P->pc->nuses; i++) {
    const ProgramUse *u = &P->pc->uses[i];
    const IrParam *ip = &m->params[u->param];
    CudaUse *c = &P->uses[P->nuses++];
    c->param = u->param;
    c->layer = u->layer;
    c->u = u;
    c->numel = 1;
    for (int k = 0; k < ip->rank; k++) c->numel *= ip->dims[k];
    if (u->owner != P->pc->chunk) { /* a tied copy the owner's stage holds: received each step */
      c->mirror = calloc((size_t)c->numel + 1, sizeof(float));
      if (!c->mirror) {
        fail(e, "out of memory");
        chunk_destroy(P);
        return NULL;
      }
      if (c->numel > largest) largest = c->numel;
      continue;
    }
    c->t = find_tensor(ctx, ip->name, u->layer);
    if (!c->t || c->t->numel != c->numel) {
      fail(e, "parameter %s (layer %" PRId64 "): %s", ip->name, u->layer,
           c->t ? "its size differs from the training loop's (recompile the artifact)" : "the training loop holds no such tensor");
      chunk_destroy(P);
      return NULL;
    }
    if (c->numel > largest) largest = c->numel;
  }
  P->host = malloc(sizeof(float) * (size_t)largest);
  P->feeds = calloc((size_t)m->ninputs + 1, sizeof(int32_t *));
  if (!P->host || !P->feeds) {
    fail(e, "out of memory");
    chunk_destroy(P);
    return NULL;
  }
  if (!first && (me == 0 || P->dev->ngpus > 0)) {
    char share[160] = "";
    if (P->dev->ngpus > 0 && ctx->comm->node_ranks > P->dev->ngpus)
      snprintf(share, sizeof share, " (%d ranks on this node share %d GPU%s)", ctx->comm->node_ranks, P->dev->ngpus,
               P->dev->ngpus > 1 ? "s" : "");
    if (me == 0 || share[0] || ctx->comm->world_size <= 8)
      fprintf(stderr, "hpdlrun: rank %d: device %s%s%s\n", me, P->dev->what, share, P->coll);
  }
  P->timing = getenv("HPDL_PROFILE") != NULL;
  P->launch_top = P->timing ? atoi(getenv("HPDL_PROFILE")) : 0;
  if (P->launch_top < 2) P->launch_top = 0;
  return P;
}

/* Micro-batch b's model inputs to the device. */
static int set_inputs(CudaProg *P, const DataBatch *b, RtErr *e) {
  const IrModule *m = P->pc->m;
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *in = &m->inputs[i];
    int64_t n = 1;
    for (int k = 0; k < in->rank; k++) n *= in->dims[k];
    ProgramFeed f = P->pc->feed[i];
    /* images are f32 (pixel / 255 - 0.5), labels, tokens and targets i32: 4 bytes a value either way */
    const void *src = f == PROGRAM_FEED_IMAGES ? (const void *)b->images
                      : f == PROGRAM_FEED_LABELS ? (const void *)b->labels
                      : f == PROGRAM_FEED_TARGETS ? (const void *)b->targets
                                                  : (const void *)b->inputs;
    int64_t per = f == PROGRAM_FEED_IMAGES ? b->image_elems : f == PROGRAM_FEED_LABELS ? 1 : b->seq_len;
    if (!src || n != b->batch * per)
      return fail(e, "input %d: the data loader gives %" PRId64 " x %" PRId64 " %s, the module takes %" PRId64, i, b->batch, per,
                  f == PROGRAM_FEED_IMAGES ? "pixels" : f == PROGRAM_FEED_LABELS ? "labels" : "tokens", n);
    if (devx_set_input(P->x, i, src, sizeof(int32_t) * (size_t)n)) return fail(e, "%s", devx_error(P->x));
  }
  return 0;
}

static int has_mirror(const ProgramUse *u, int stage) {
  for (int k = 0; k < u->nmirrors; k++)
    if (u->mirrors[k] == stage) return 1;
  return 0;
}

/* Tied parameters across chunks: the owner's chunk sends each copy's
 * values to the chunks that read it too before the step (grads = 0), and
 * they send its gradient back after it (grads = 1), in the CPU program's
 * order - owner chunk, mirror chunk, then the uses in order - so that sends
 * and receives pair without a cycle of waits. */
static int stage_tie(CudaStage *S, int grads, RtErr *e) {
  int tag = grads ? COMM_TAG_TIE_GRAD : COMM_TAG_TIE_PARAM;
  for (int o = 0; o < S->nchunks; o++)
    for (int d = o + 1; d < S->nchunks; d++) {
      CudaProg *xo = held(S, o), *xd = held(S, d), *P = xo ? xo : xd;
      if (!P) continue;
      Comm *c = P->comm;
      for (int i = 0; i < P->nuses; i++) {
        CudaUse *u = &P->uses[i];
        int rc = 0;
        if (P == xo && u->t && has_mirror(u->u, d)) { /* the owner */
          if (xd) return fail(e, "chunks %d and %d share a parameter and both run on stage %d (recompile the artifact)", o, d, P->stage);
          if (!grads) {
            /* resident: the values are the device's */
            const float *v = u->t->data;
            if (P->resident && devx_get_param_copy(P->x, u->param, u->layer, (float *)(v = P->host))) return fail(e, "%s", devx_error(P->x));
            rc = c->ops->send(c, COMM_PP, COMM_F32, v, u->numel, d % P->pp, tag, e);
          } else if (!(rc = c->ops->recv(c, COMM_PP, COMM_F32, P->host, u->numel, d % P->pp, tag, e))) {
            /* resident: added into the device's gradient, the loop's (idle) as the staging */
            if (P->resident && devx_get_grad_copy(P->x, u->param, u->layer, u->t->grad)) return fail(e, "%s", devx_error(P->x));
            for (int64_t k = 0; k < u->numel; k++) u->t->grad[k] += P->host[k];
            if (P->resident && devx_set_grad_copy(P->x, u->param, u->layer, u->t->grad)) return fail(e, "%s", devx_error(P->x));
          }
        } else if (P == xd && u->mirror && u->u->owner == o) { /* a mirror */
          if (!grads) {
            rc = c->ops->recv(c, COMM_PP, COMM_F32, u->mirror, u->numel, o % P->pp, tag, e);
            if (!rc && P->resident && devx_set_param_copy(P->x, u->param, u->layer, u->mirror)) return fail(e, "%s", devx_error(P->x));
          } else if (devx_get_grad_copy(P->x, u->param, u->layer, P->host)) rc = fail(e, "%s", devx_error(P->x));
          else rc = c->ops->send(c, COMM_PP, COMM_F32, P->host, u->numel, o % P->pp, tag, e);
        }
        if (rc) return -1;
      }
    }
  return 0;
}

/* This stage's instruction list for nmicro micro-batches: what hpdlc
 * compile recorded, rebuilt for another count; each chunk learns its last
 * backward (the micro-batch whose gradients are final). */
static int stage_schedule(CudaStage *S, int nmicro, RtErr *e) {
  if (S->ins && S->ins_m == nmicro) return 0;
  free(S->ins);
  S->ins = NULL;
  const ProgramChunk *pc = S->c[0]->pc;
  int n = 0;
  S->ins = sched_stage_list(pc->schedule, S->pp, nmicro, S->v, S->stage, pc->ins, pc->nins, pc->sched_m, 0, &n);
  if (!S->ins) return fail(e, "out of memory for the pipeline's instruction list");
  S->nins = n;
  S->ins_m = nmicro;
  for (int c = 0; c < S->n; c++) S->c[c]->last_bwd = -1;
  for (int i = 0; i < n; i++) {
    const SchedInstr *in = &S->ins[i];
    if (in->op != SCHED_OP_FWD && in->op != SCHED_OP_BWD) continue;
    CudaProg *P = held(S, in->chunk);
    if (!P || in->mb < 0 || in->mb >= nmicro)
      return fail(e, "stage %d: the instruction list runs chunk %d, micro-batch %d, which this rank does not hold (recompile the artifact)",
                  S->stage, in->chunk, in->mb);
    if (in->op == SCHED_OP_BWD) P->last_bwd = i;
  }
  return 0;
}

/* The micro-batches of a pipeline stage, in its schedule's order: each
 * forward half leaves a frame its backward half takes up. */
static int run_pipeline(CudaStage *S, TrainCtx *ctx, const DataBatch *const *micro, int nmicro, double *total, RtErr *e) {
  if (stage_schedule(S, nmicro, e)) return -1;
  for (int c = 0; c < S->n; c++)
    if (!S->c[c]->frames && !(S->c[c]->frames = calloc((size_t)nmicro + 1, sizeof(DevxFrame *)))) return fail(e, "out of memory");
  CudaProg *P0 = S->c[0];
  int rc = 0;
  for (int i = 0; i < S->nins && !rc; i++) {
    const SchedInstr *in = &S->ins[i];
    if (in->op != SCHED_OP_FWD && in->op != SCHED_OP_BWD) continue;
    CudaProg *P = held(S, in->chunk);
    int k = in->mb;
    P->cur_mb = k;
    double pt = P->pf ? P->pf->now(P->pf->self) : 0;
    if (in->op == SCHED_OP_FWD) {
      if (P->frames[k]) rc = fail(e, "chunk %d: micro-batch %d's forward twice (a bad instruction list)", P->chunk, k);
      else if (!(rc = set_inputs(P, micro[k], e)) && !(P->frames[k] = devx_step_forward(P->x, P->pc->step, (float)ctx->grad_scale)))
        rc = fail(e, "stage %d, chunk %d, forward of micro-batch %d: %s", P->stage, P->chunk, k, devx_error(P->x));
    } else {
      float l = 0;
      DevxFrame *f = P->frames[k];
      P->frames[k] = NULL;
      if (!f) rc = fail(e, "chunk %d: micro-batch %d's backward before its forward (a bad instruction list)", P->chunk, k);
      else {
        devx_micro_begin(P->x, i == P->last_bwd && !ctx->eval);
        if (devx_step_backward(P->x, f, &l) || devx_micro_end(P->x))
          rc = fail(e, "stage %d, chunk %d, backward of micro-batch %d: %s", P->stage, P->chunk, k, devx_error(P->x));
      }
      *total += l;
    }
    if (P->pf)
      P->pf->span(P->pf->self, in->op == SCHED_OP_FWD ? "forward" : "backward", in->op == SCHED_OP_FWD ? "forward" : "backward", pt,
                  P->pf->now(P->pf->self), k, in->chunk, -1, 0, 0);
    if (!rc) rc = comm_ring_finish(&P->ring, e);
    /* NCCL holds this instruction's sends until the next receive, so that
     * a send and its neighbour's send back are posted together; where the
     * next instruction starts with no receive (the first chunk's forwards,
     * the last chunk's backwards) they are posted now, not after it */
    int j = i + 1; /* the next computation (the list's transfer entries happen inside the halves) */
    while (j < S->nins && S->ins[j].op != SCHED_OP_FWD && S->ins[j].op != SCHED_OP_BWD) j++;
    if (!rc && P0->dcomm && j < S->nins) {
      const SchedInstr *nx = &S->ins[j];
      int receives = (nx->op == SCHED_OP_FWD && nx->chunk > 0) || (nx->op == SCHED_OP_BWD && nx->chunk < S->nchunks - 1);
      if (!receives) rc = comm_wait_sends(P0->dcomm, e); /* posted; the buffers kept to the step's end */
    }
  }
  /* NCCL: every send posted, the launches after the pipeline's stream, then the buffers back */
  if (!rc && P0->dcomm && (comm_wait_sends(P0->dcomm, e) || comm_nccl_sync_group(P0->dcomm, COMM_PP, e))) rc = -1;
  for (int c = 0; c < S->n && !rc; c++) rc = comm_outbox_flush(&S->c[c]->outbox, chunk_comm(S->c[c]), e);
  return rc;
}

/* ---- overlap: the data-parallel sum while the backward goes on ---- */

static CommGroup dp_group_of(const CudaUse *c) { return train_tensor_is_expert(c->t) ? COMM_EDP : COMM_DP; }

/* The compressed sums' exchanges (devcomp.h's DevzExchange): NCCL on the
 * device's buffers on the given stream, or the loop's Comm through host
 * memory (P->zstage). */
typedef struct {
  CudaProg *P;
  Comm *comm;
  CommGroup group;
  int nccl;
} CompWay;

static int comp_exchange(void *ctx, DevzHow how, int esize, const void *in, int64_t count, void *out, void *stream, char *err,
                         size_t errlen) {
  CompWay *c = ctx;
  Device *d = c->P->dev;
  CommType t = esize == 1 ? COMM_U8 : COMM_F32;
  RtErr e;
  int rc;
  if (c->nccl) {
    if (stream && d->ops->stream_wait(d, stream, NULL)) return snprintf(err, errlen, "%s", dev_error(d)), -1;
    comm_nccl_set_stream(c->comm, stream);
    rc = how == DEVZ_ALL_TO_ALL ? comm_all_to_all(c->comm, c->group, t, in, count, out, &e)
                                : comm_all_gather(c->comm, c->group, t, in, count, out, &e);
    comm_nccl_set_stream(c->comm, NULL);
    return rc < 0 ? (snprintf(err, errlen, "%s", e.msg), -1) : 0;
  }
  int members = c->comm->size[c->group];
  size_t nin = (size_t)((how == DEVZ_ALL_TO_ALL ? members : 1) * count * esize), nout = (size_t)(members * count * esize);
  CudaProg *P = c->P;
  if (nin + nout > P->zstage_cap) {
    unsigned char *h = realloc(P->zstage, nin + nout);
    if (!h) return snprintf(err, errlen, "out of memory for the compressed sums' staging (%zu bytes)", nin + nout), -1;
    P->zstage = h;
    P->zstage_cap = nin + nout;
  }
  if (d->ops->to_host(d, P->zstage, in, nin))
    return snprintf(err, errlen, "the compressed gradients to the host: %s", dev_error(d)), -1;
  rc = how == DEVZ_ALL_TO_ALL ? comm_all_to_all(c->comm, c->group, t, P->zstage, count, P->zstage + nin, &e)
                              : comm_all_gather(c->comm, c->group, t, P->zstage, count, P->zstage + nin, &e);
  if (rc < 0) return snprintf(err, errlen, "%s", e.msg), -1;
  if (d->ops->to_device(d, out, P->zstage + nin, nout))
    return snprintf(err, errlen, "the compressed gradients to the device: %s", dev_error(d)), -1;
  return 0;
}

/* An all-reduce of compressed values in comm.c's reduce-scatter form (from COMM_COMPRESS_RS_FROM members). */
static int comp_rs(int members) { return members >= COMM_COMPRESS_RS_FROM; }

/* Use c's gradient is summed compressed (devcomp.h): over dp, not an
 * expert's over edp (uncompressed, as the loop's). */
static int compressed(const CudaProg *P, const CudaUse *c) { return P->comp && dp_group_of(c) == COMM_DP; }

/* Use u's gradient summed compressed over dp, the way cw says, the kernels
 * after its exchanges on `stream`, in the batch begun; RtErr on failure. */
static int comp_use(CudaProg *P, CompWay *cw, void *stream, int u, RtErr *e) {
  const CudaUse *c = &P->uses[u];
  int members = cw->comm->size[COMM_DP];
  DevzWay w = {comp_exchange, cw, members, stream};
  if (devz_all_reduce(P->comp, &w, comp_rs(members), devx_grad_ptr(P->x, c->param, c->layer), c->numel, P->comp_at[u]))
    return fail(e, "%s", devz_error(P->comp));
  return 0;
}

/* The compressed sums of the uses of sum_uses's list that are: one batch,
 * each use's rounding on the launch stream, its exchange and sum after on
 * the comm stream (or the launch stream without overlap). */
static int sum_compressed(CudaProg *P, const int *list, int n, RtErr *e) {
  int members = P->comm->size[COMM_DP];
  int64_t bytes = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < (list ? n : P->nuses); i++) {
      int u = list ? list[i] : i;
      const CudaUse *c = &P->uses[u];
      if (!list && (!c->t || (P->reduced && P->reduced[u]))) continue;
      if (!compressed(P, c) || members <= 1) continue;
      CompWay cw = {P, P->dcomm, COMM_DP, 1};
      if (pass == 0) bytes += devz_all_reduce_bytes(c->numel, members, comp_rs(members));
      else if (comp_use(P, &cw, P->cstream, u, e)) return -1;
    }
    if (pass == 0 && !bytes) return 0;
    if (pass == 0 && devz_batch(P->comp, bytes)) return fail(e, "%s", devz_error(P->comp));
  }
  return 0;
}

/* The data-parallel sums of the uses in list[0..n), or with list NULL of
 * every use not summed yet this step, in one NCCL group: on the comm stream
 * after everything launched so far (overlap), else on the launch stream
 * (the compressed ones first, each on its own: sum_compressed). */
static int sum_uses(CudaProg *P, const int *list, int n, RtErr *e) {
  Device *d = P->dev;
  if (P->comp && sum_compressed(P, list, n, e)) return -1;
  if (P->cstream && d->ops->stream_wait(d, P->cstream, NULL)) return fail(e, "%s", dev_error(d));
  comm_nccl_set_stream(P->dcomm, P->cstream);
  int rc = comm_group(P->dcomm, 1, e);
  for (int i = 0; i < (list ? n : P->nuses) && !rc; i++) {
    int u = list ? list[i] : i;
    const CudaUse *c = &P->uses[u];
    if (!list && (!c->t || (P->reduced && P->reduced[u]) || P->comm->size[dp_group_of(c)] <= 1)) continue;
    if (compressed(P, c)) continue; /* (sum_compressed's) */
    rc = comm_all_reduce(P->dcomm, dp_group_of(c), COMM_F32, COMM_SUM, devx_grad_ptr(P->x, c->param, c->layer), c->numel, e);
  }
  RtErr ge;
  if (comm_group(P->dcomm, 0, &ge) && !rc) rc = fail(e, "%s", ge.msg);
  comm_nccl_set_stream(P->dcomm, NULL);
  return rc;
}

static int flush_bucket(CudaProg *P, RtErr *e) {
  int rc = P->nbucket ? sum_uses(P, P->bucket, P->nbucket, e) : 0;
  P->nbucket = 0;
  P->bucket_bytes = 0;
  return rc;
}

/* devx's hook: copy `copy` of parameter `param` is final; a tied copy waits
 * for its mirrors' gradients (tie, after the step). */
static int grad_ready(void *ctx, int param, int64_t copy, char *err, size_t errlen) {
  CudaProg *P = ctx;
  int u = P->use_at[devx_copy_index(P->x, param, copy)];
  if (u < 0) return 0;
  const CudaUse *c = &P->uses[u];
  if (!c->t || c->u->nmirrors > 0 || P->reduced[u] || P->comm->size[dp_group_of(c)] <= 1) return 0;
  P->reduced[u] = 1;
  P->bucket[P->nbucket++] = u;
  P->bucket_bytes += sizeof(float) * (size_t)c->numel;
  RtErr e;
  if (P->bucket_bytes >= P->bucket_cap && flush_bucket(P, &e)) return snprintf(err, errlen, "%s", e.msg), -1;
  return 0;
}

/* With the parameters resident on dp > 1 members and NCCL: the comm stream
 * and the hook (HPDL_OVERLAP=0 sums every gradient after the step). */
static int overlap_setup(CudaProg *P, TrainCtx *ctx) {
  const char *off = getenv("HPDL_OVERLAP");
  if (!P->dcomm || ctx->comm->size[COMM_DP] <= 1 || (off && !strcmp(off, "0")) || !P->dev->ops->stream_create) return 0;
  const IrModule *m = P->pc->m;
  int64_t n = devx_copy_index(P->x, m->nparams, 0);
  P->use_at = malloc(sizeof(int) * (size_t)(n + 1));
  P->reduced = calloc((size_t)P->nuses + 1, 1);
  P->bucket = calloc((size_t)P->nuses + 1, sizeof(int));
  if (!P->use_at || !P->reduced || !P->bucket) return -1;
  for (int64_t i = 0; i < n; i++) P->use_at[i] = -1;
  for (int u = 0; u < P->nuses; u++) P->use_at[devx_copy_index(P->x, P->uses[u].param, P->uses[u].layer)] = u;
  /* PyTorch DDP's default bucket: 25 MiB (HPDL_BUCKET_MB) */
  const char *mb = getenv("HPDL_BUCKET_MB");
  P->bucket_cap = (size_t)((mb && atof(mb) >= 0 ? atof(mb) : 25.0) * 1048576.0);
  if (!(P->cstream = P->dev->ops->stream_create(P->dev))) return -1;
  return devx_set_grad_ready(P->x, grad_ready, P);
}

/* ---- ZeRO on the device ----
 *
 * devexec's blocks of the parameters and of the gradients are laid out by
 * layer (DevxFlat.by_layer: the unrepeated parameters, then one unit per
 * layer), each unit a multiple of 16 x dp values and split evenly over dp:
 * member r owns [os(u), os(u) + ol(u)) of unit u, os(u) = start[u] +
 * r x ol(u), ol(u) = its length / dp, and keeps that part's moments (and
 * at ZeRO 2 its reduced gradients, at ZeRO 3 its parameters) at zoff[u] of
 * its ranges. ZeRO 1: the gradients reduce-scattered in place unit by unit
 * as the backward finishes them (the grad-ready hook), the parameters
 * all-gathered in place after the update. ZeRO 2: the gradients' block
 * freed; each layer's gradients in a pool buffer for its backward,
 * reduce-scattered as it ends (the layer hook). ZeRO 3: the parameters'
 * block freed too; a layer's unit all-gathered into a pool buffer before it
 * runs - the next one while it runs - and handed back after, the
 * unrepeated ones for the whole step. */

static int64_t unit_own(const CudaProg *P, int u) { return (P->ustart[u + 1] - P->ustart[u]) / P->dp; }

/* The unit holding flat index q, or -1 (not held, or an expert's: kept apart, DevxFlat.experts_apart). */
static int unit_of(const CudaProg *P, int64_t q) {
  if (q < 0 || q >= P->ustart[P->nunits]) return -1;
  int u = 0;
  while (u + 1 < P->nunits && q >= P->ustart[u + 1]) u++;
  return u;
}

/* Where block value q lies after an all-gather of every member's zown
 * values (member by member), and how many values after it lie alike. */
static int64_t gathered_at(const CudaProg *P, int64_t q, int64_t *run) {
  int u = unit_of(P, q);
  int64_t ol = unit_own(P, u), k = q - P->ustart[u];
  *run = ol - k % ol;
  return (k / ol) * P->zown + P->zoff[u] + k % ol;
}

/* Where this member's part of unit u starts in the blocks. */
static int64_t unit_own_start(const CudaProg *P, int u) { return P->ustart[u] + (int64_t)P->dprank * unit_own(P, u); }

/* The data-parallel group's sum reduce-scatter (gather 0: in holds n values
 * a member, out receives this member's n of their sum) or all-gather
 * (gather 1: in holds this member's n, out everyone's) of device buffers
 * (`what` in messages): NCCL on `stream` once the launches so far are done
 * (NULL: the launch stream), else through host memory (zhost). */
static int dp_collective(CudaProg *P, TrainCtx *ctx, int gather, void *stream, const float *in, int64_t n, float *out,
                         const char *what, RtErr *e) {
  Device *d = P->dev;
  if (P->dcomm) {
    if (stream && d->ops->stream_wait(d, stream, NULL)) return fail(e, "%s", dev_error(d));
    comm_nccl_set_stream(P->dcomm, stream);
    int rc = (gather ? comm_all_gather(P->dcomm, COMM_DP, COMM_F32, in, n, out, e)
                     : comm_reduce_scatter(P->dcomm, COMM_DP, COMM_F32, COMM_SUM, in, n, out, e)) < 0
                 ? -1
                 : 0;
    comm_nccl_set_stream(P->dcomm, NULL);
    return rc;
  }
  int64_t nin = gather ? n : n * P->dp, nout = gather ? n * P->dp : n;
  float *hin = gather ? P->zhost + P->zlen : P->zhost, *hout = gather ? P->zhost : P->zhost + P->zlen;
  if (d->ops->to_host(d, hin, in, sizeof(float) * (size_t)nin)) return fail(e, "the %s to the host: %s", what, dev_error(d));
  if ((gather ? comm_all_gather(ctx->comm, COMM_DP, COMM_F32, hin, n, hout, e)
              : comm_reduce_scatter(ctx->comm, COMM_DP, COMM_F32, COMM_SUM, hin, n, hout, e)) < 0)
    return -1;
  if (d->ops->to_device(d, out, hout, sizeof(float) * (size_t)nout)) return fail(e, "the %s to the device: %s", what, dev_error(d));
  return 0;
}

/* Unit u's gradients (in: the unit's values) reduce-scattered over dp, this
 * member's part of the sums into out: dp_collective's, or compressed
 * (devcomp.h, its own batch; error feedback's residual of the unit's
 * values at their flat places). */
static int unit_reduce_scatter(CudaProg *P, TrainCtx *ctx, int u, void *stream, const float *in, float *out, RtErr *e) {
  if (!P->comp) return dp_collective(P, ctx, 0, stream, in, unit_own(P, u), out, "gradients", e);
  CompWay cw = {P, P->dcomm ? P->dcomm : ctx->comm, COMM_DP, P->dcomm != NULL};
  DevzWay w = {comp_exchange, &cw, P->dp, P->dcomm ? stream : NULL};
  if (devz_batch(P->comp, devz_reduce_scatter_bytes(unit_own(P, u), P->dp)) ||
      devz_reduce_scatter(P->comp, &w, in, unit_own(P, u), out, P->ustart[u]))
    return fail(e, "%s", devz_error(P->comp));
  return 0;
}

/* ZeRO 1: unit u's gradients summed over dp onto their owners, in place in
 * the block, on the launch stream or, with `stream`, on the comm stream. */
static int unit_reduce(CudaProg *P, TrainCtx *ctx, int u, int stream, RtErr *e) {
  void *g;
  devx_flat(P->x, NULL, &g);
  P->ureduced[u] = 1;
  P->uall++;
  return unit_reduce_scatter(P, ctx, u, stream ? P->cstream : NULL, (float *)g + P->ustart[u], (float *)g + unit_own_start(P, u), e);
}

/* devx's hook (NCCL): a parameter copy's gradient is final; a unit whose
 * every copy is final is reduce-scattered now, while the backward goes on
 * (a unit with a tied copy waits for the mirrors' gradients: tie, after
 * the step). */
static int zero_grad_ready(void *ctx, int param, int64_t copy, char *err, size_t errlen) {
  CudaProg *P = ctx;
  int u = unit_of(P, devx_flat_index(P->x, param, copy));
  if (u < 0 || P->ulate[u] || P->ureduced[u] || --P->uleft[u] > 0) return 0;
  P->uearly++;
  RtErr e;
  if (unit_reduce(P, P->tctx, u, 1, &e)) return snprintf(err, errlen, "%s", e.msg), -1;
  return 0;
}

static int grad_close(CudaProg *P, TrainCtx *ctx, int u, RtErr *e);
static int grad_settle(CudaProg *P, RtErr *e);

/* The step's gradients summed over dp onto their owners: ZeRO 2 and 3 the
 * unrepeated unit's (the layers' went as their backward ended), ZeRO 1 the
 * units the backward did not start (with NCCL in one group). */
static int zero_reduce(CudaProg *P, TrainCtx *ctx, RtErr *e) {
  Device *d = P->dev;
  if (P->zero >= 2) {
    for (int u = 0; u < P->nunits; u++)
      if (P->ugrad[u] && (grad_settle(P, e) || grad_close(P, ctx, u, e))) return -1;
    return grad_settle(P, e);
  }
  /* (compressed: each unit's exchange between two kernels, no group) */
  int grouped = P->dcomm && !P->comp, rc = grouped ? comm_group(P->dcomm, 1, e) : 0;
  for (int u = 0; u < P->nunits && !rc; u++)
    if (!P->ureduced[u]) rc = unit_reduce(P, ctx, u, 0, e);
  if (grouped) {
    RtErr ge;
    if (comm_group(P->dcomm, 0, &ge) && !rc) rc = fail(e, "%s", ge.msg);
  }
  if (P->dcomm) {
    if (!rc && P->cstream && d->ops->stream_wait(d, NULL, P->cstream)) rc = fail(e, "%s", dev_error(d));
  }
  return rc;
}

/* ZeRO 1 and 2, after the update: every member's part of each unit to all
 * (NCCL in place, one group; else through host memory). */
static int zero_gather(CudaProg *P, TrainCtx *ctx, RtErr *e) {
  void *pb;
  devx_flat(P->x, &pb, NULL);
  int rc = P->dcomm ? comm_group(P->dcomm, 1, e) : 0;
  for (int u = 0; u < P->nunits && !rc; u++)
    rc = dp_collective(P, ctx, 1, NULL, (float *)pb + unit_own_start(P, u), unit_own(P, u), (float *)pb + P->ustart[u],
                       "parameters", e);
  RtErr ge;
  if (P->dcomm && comm_group(P->dcomm, 0, &ge) && !rc) rc = fail(e, "%s", ge.msg);
  return rc;
}

/* Unit u gathers in bf16 (Unit16). */
static int gathers16(const CudaProg *P, int u) { return P->u16 && P->u16[u].on; }

/* Unit16's buffers' bytes: stage, b16, gath, f32. */
static size_t u16_stage(const CudaProg *P, int u) { return 2 * (size_t)unit_own(P, u) + 4 * (size_t)(P->u16[u].nmax + 1); }
static size_t u16_b16(const CudaProg *P, int u) { return 2 * (size_t)(unit_own(P, u) * P->dp); }
static size_t u16_gath(const CudaProg *P, int u) { return 4 * (size_t)(P->u16[u].nmax * P->dp + 1); }
static size_t u16_f32(const CudaProg *P, int u) { return 4 * (size_t)(P->u16[u].n32 + 1); }

static void *to_device_i64(Device *d, const int64_t *v, int64_t n) {
  void *p = d->ops->alloc(d, sizeof(int64_t) * (size_t)(n + 1));
  if (p && n > 0 && d->ops->to_device(d, p, v, sizeof(int64_t) * (size_t)n)) {
    d->ops->release(d, p);
    return NULL;
  }
  return p;
}

/* Unit16 for the layer units where some weight is read in bf16 (ZeRO 3):
 * the fp32 values' places, each member's slice being [r ol, (r + 1) ol)
 * of the unit. 0, or -1 with why. */
static int gather16_setup(CudaProg *P, char *why, size_t whylen) {
  const char *mode = getenv("HPDL_ZERO3_GATHER");
  if (mode && !strcmp(mode, "fp32")) return 0;
  if (!(P->u16 = calloc((size_t)P->nunits + 1, sizeof(Unit16)))) return snprintf(why, whylen, "out of memory"), -1;
  if (devx_reads_from(P->x, P->pc->step)) return snprintf(why, whylen, "%s", devx_error(P->x)), -1;
  int rc = 0;
  for (int u = 1; u < P->nunits && !rc; u++) {
    Unit16 *g = &P->u16[u];
    int any16 = 0, n = devx_unit_reads(P->x, u, NULL, NULL, 0, &any16);
    int64_t ol = unit_own(P, u);
    if (!any16 || ol % 2) continue; /* (ol is a multiple of 16: DevxFlat.unit) */
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(n + 1)), *len = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int64_t *cnt = calloc((size_t)P->dp, sizeof(int64_t)), *seen = calloc((size_t)P->dp, sizeof(int64_t));
    if (!off || !len || !cnt || !seen) rc = (snprintf(why, whylen, "out of memory"), -1);
    if (!rc) devx_unit_reads(P->x, u, off, len, n, &any16);
    for (int i = 0; i < n && !rc; i++) {
      if (i && off[i] < off[i - 1] + len[i - 1]) rc = (snprintf(why, whylen, "unit %d's parameters out of order", u), -1);
      g->n32 += len[i];
      for (int64_t q = off[i]; q < off[i] + len[i]; q++) cnt[q / ol]++;
    }
    for (int r = 0; r < P->dp && !rc; r++)
      if (cnt[r] > g->nmax) g->nmax = cnt[r];
    g->nme = rc ? 0 : cnt[P->dprank];
    int64_t *pack = malloc(sizeof(int64_t) * (size_t)(g->nme + 1)), *unpack = malloc(sizeof(int64_t) * (size_t)(g->n32 + 1));
    if (!rc && (!pack || !unpack)) rc = (snprintf(why, whylen, "out of memory"), -1);
    int64_t np = 0, nu = 0;
    for (int i = 0; i < n && !rc; i++)
      for (int64_t q = off[i]; q < off[i] + len[i]; q++) {
        int64_t r = q / ol;
        if (r == P->dprank) pack[np++] = q - r * ol;
        unpack[nu++] = r * g->nmax + seen[r]++;
      }
    if (!rc && (!(g->pack = to_device_i64(P->dev, pack, g->nme)) || !(g->unpack = to_device_i64(P->dev, unpack, g->n32))))
      rc = (snprintf(why, whylen, "the bf16 gathers' tables: %s", dev_error(P->dev)), -1);
    g->on = !rc;
    free(off);
    free(len);
    free(cnt);
    free(seen);
    free(pack);
    free(unpack);
  }
  return rc;
}

static void gather16_free(CudaProg *P) {
  for (int u = 0; P->u16 && u < P->nunits; u++) {
    if (P->u16[u].pack) P->dev->ops->release(P->dev, P->u16[u].pack);
    if (P->u16[u].unpack) P->dev->ops->release(P->dev, P->u16[u].unpack);
  }
  free(P->u16);
  P->u16 = NULL;
}

/* Unit16's buffers back to the pool. */
static void gather16_put(CudaProg *P, int u) {
  Unit16 *g = &P->u16[u];
  void **b[4] = {&g->stage, &g->b16, &g->gath, &g->f32};
  size_t n[4] = {u16_stage(P, u), u16_b16(P, u), u16_gath(P, u), u16_f32(P, u)};
  for (int i = 0; i < 4; i++)
    if (*b[i]) devx_buffer_put(P->x, *b[i], n[i]), *b[i] = NULL;
}

/* Unit16: this member's slice rounded and its fp32 values packed (launch
 * stream), both all-gathered (as dp_collective's), the unit pointed at;
 * the fp32 values are unpacked when the layer runs (gather16_ready). */
static int unit_gather16(CudaProg *P, TrainCtx *ctx, int u, char *err, size_t errlen) {
  Unit16 *g = &P->u16[u];
  int64_t ol = unit_own(P, u);
  const float *own = (const float *)P->zp + P->zoff[u];
  g->stage = devx_buffer(P->x, u16_stage(P, u));
  g->b16 = g->stage ? devx_buffer(P->x, u16_b16(P, u)) : NULL;
  g->gath = g->b16 ? devx_buffer(P->x, u16_gath(P, u)) : NULL;
  g->f32 = g->gath ? devx_buffer(P->x, u16_f32(P, u)) : NULL;
  float *packed = g->stage ? (float *)((char *)g->stage + 2 * (size_t)ol) : NULL;
  RtErr e;
  int rc = !g->f32 ? snprintf(err, errlen, "%s", devx_error(P->x)), -1 : 0;
  if (!rc && (devx_round16(P->x, own, g->stage, ol) || devx_take(P->x, own, g->pack, packed, g->nme)))
    rc = (snprintf(err, errlen, "%s", devx_error(P->x)), -1);
  if (!rc && (dp_collective(P, ctx, 1, P->cstream, g->stage, ol / 2, g->b16, "bf16 weights", &e) ||
              (g->nmax && dp_collective(P, ctx, 1, P->cstream, packed, g->nmax, g->gath, "parameters read in fp32", &e))))
    rc = (snprintf(err, errlen, "gathering the parameters of unit %d: %s", u, e.msg), -1);
  if (rc) {
    gather16_put(P, u);
    return -1;
  }
  P->ubuf[u] = g->b16;
  devx_point_unit16(P->x, u, g->b16, g->f32);
  return 0;
}

/* Unit16, once the launches waited for the gathers: the fp32 values into
 * the unit's order, the buffers sent and received back to the pool. */
static int gather16_ready(CudaProg *P, int u, char *err, size_t errlen) {
  Unit16 *g = &P->u16[u];
  if (!g->stage) return 0;
  if (devx_take(P->x, g->gath, g->unpack, g->f32, g->n32)) return snprintf(err, errlen, "%s", devx_error(P->x)), -1;
  devx_buffer_put(P->x, g->stage, u16_stage(P, u));
  devx_buffer_put(P->x, g->gath, u16_gath(P, u));
  g->stage = g->gath = NULL;
  return 0;
}

/* ZeRO 3: unit u's parameters from their owners into a pool buffer (NCCL:
 * on the comm stream once the launches so far are done, so that a recycled
 * buffer is free; its user waits for the stream), and pointed at. */
static int unit_gather(CudaProg *P, TrainCtx *ctx, int u, char *err, size_t errlen) {
  if (gathers16(P, u)) return unit_gather16(P, ctx, u, err, errlen);
  int64_t ol = unit_own(P, u), len = ol * P->dp;
  RtErr e;
  void *buf = devx_buffer(P->x, sizeof(float) * (size_t)(len ? len : 1));
  if (!buf) return snprintf(err, errlen, "%s", devx_error(P->x)), -1;
  if (dp_collective(P, ctx, 1, P->cstream, (float *)P->zp + P->zoff[u], ol, buf, "parameters", &e)) {
    devx_buffer_put(P->x, buf, sizeof(float) * (size_t)(len ? len : 1));
    return snprintf(err, errlen, "gathering the parameters of unit %d: %s", u, e.msg), -1;
  }
  P->ubuf[u] = buf;
  devx_point_unit(P->x, u, buf);
  return 0;
}

static void unit_release(CudaProg *P, int u) {
  if (!P->ubuf[u]) return;
  if (gathers16(P, u)) {
    devx_point_unit16(P->x, u, NULL, NULL);
    gather16_put(P, u);
    P->ubuf[u] = NULL;
    P->uref[u] = 0;
    return;
  }
  int64_t len = unit_own(P, u) * P->dp;
  devx_point_unit(P->x, u, NULL);
  devx_buffer_put(P->x, P->ubuf[u], sizeof(float) * (size_t)(len ? len : 1));
  P->ubuf[u] = NULL;
  P->uref[u] = 0;
}

/* ZeRO 2 and 3: unit u's gradients get a zeroed buffer of the pool. */
static int grad_open(CudaProg *P, int u, RtErr *e) {
  size_t bytes = sizeof(float) * (size_t)(P->ustart[u + 1] - P->ustart[u] + 1);
  void *b = devx_buffer(P->x, bytes);
  if (!b) return fail(e, "%s", devx_error(P->x));
  if (P->dev->ops->zero(P->dev, b, bytes)) {
    devx_buffer_put(P->x, b, bytes);
    return fail(e, "%s", dev_error(P->dev));
  }
  P->ugrad[u] = b;
  devx_point_grad_unit(P->x, u, b);
  return 0;
}

/* The launches wait for the reduce-scatters so far; their sums are added
 * into zg and their buffers go back to the pool. */
static int grad_settle(CudaProg *P, RtErr *e) {
  Device *d = P->dev;
  if (P->rstream && P->nretired && d->ops->stream_wait(d, NULL, P->rstream)) return fail(e, "%s", dev_error(d));
  for (int u = 0; u < P->nunits; u++)
    if (P->uadd[u]) {
      P->uadd[u] = 0;
      if (devx_add(P->x, (float *)P->zg + P->zoff[u], (float *)P->zt + P->zoff[u], unit_own(P, u))) return fail(e, "%s", devx_error(P->x));
    }
  for (int i = 0; i < P->nretired; i++) devx_buffer_put(P->x, P->retired[i], P->retired_bytes[i]);
  P->nretired = 0;
  return 0;
}

/* Unit u's gradients of this micro-batch reduce-scattered into zt's slice:
 * with NCCL on rstream once the launches so far are done (the layers
 * before it keep computing), else through host memory. */
static int grad_close(CudaProg *P, TrainCtx *ctx, int u, RtErr *e) {
  int64_t ol = unit_own(P, u);
  size_t bytes = sizeof(float) * (size_t)(ol * P->dp + 1);
  float *in = P->ugrad[u];
  devx_point_grad_unit(P->x, u, NULL);
  P->ugrad[u] = NULL;
  int rc = unit_reduce_scatter(P, ctx, u, P->rstream, in, (float *)P->zt + P->zoff[u], e);
  P->retired[P->nretired] = in;
  P->retired_bytes[P->nretired++] = bytes;
  P->uadd[u] = 1;
  P->uall++;
  return rc;
}

/* devx's layer hook under ZeRO 2 and 3 (layer l is unit 1 + l): ZeRO 3's
 * parameters gathered for the layer and the next one's started, released
 * after; the layer's gradients in a buffer of their own for its backward,
 * reduce-scattered as it ends (the one before settled first, so that two
 * or three units' gradients are held at a time). */
static int zero_layer(void *ctx, int64_t layer, int phase, char *err, size_t errlen) {
  CudaProg *P = ctx;
  int u = devx_layer_unit(P->x, layer);
  RtErr e;
  if (u < 1) return 0;
  if (phase == DEVX_LAYER_BWD_END && P->ugref[u] > 0 && --P->ugref[u] == 0) {
    if (grad_settle(P, &e) || grad_close(P, P->tctx, u, &e)) return snprintf(err, errlen, "%s", e.msg), -1;
    P->uearly++;
  }
  if (phase == DEVX_LAYER_BWD_BEGIN && P->ugref[u]++ == 0 && grad_open(P, u, &e)) return snprintf(err, errlen, "%s", e.msg), -1;
  if (P->zero < 3) return 0;
  if (phase == DEVX_LAYER_FWD_END || phase == DEVX_LAYER_BWD_END) {
    if (P->uref[u] > 0 && --P->uref[u] == 0) unit_release(P, u);
    return 0;
  }
  if (!P->ubuf[u] && unit_gather(P, P->tctx, u, err, errlen)) return -1;
  P->uref[u]++; /* (a gathered unit is pointed at: unit_gather) */
  /* the launches wait for the gathers so far (this unit's; bf16: then its
   * weights' copies rounded); the next unit's starts */
  if (P->cstream && P->dev->ops->stream_wait(P->dev, NULL, P->cstream)) return snprintf(err, errlen, "%s", dev_error(P->dev)), -1;
  if (gathers16(P, u) && gather16_ready(P, u, err, errlen)) return -1;
  if (!gathers16(P, u) && devx_refresh16_unit(P->x, u)) return snprintf(err, errlen, "%s", devx_error(P->x)), -1;
  int next = phase == DEVX_LAYER_FWD_BEGIN ? u + 1 : u - 1;
  if (next >= 1 && next < P->nunits && !P->ubuf[next] && unit_gather(P, P->tctx, next, err, errlen)) return -1;
  return 0;
}

/* The part [*lo, *hi) of [a, a + n) that lies in [from, from + len); 0 when none. */
static int overlap_of(int64_t a, int64_t n, int64_t from, int64_t len, int64_t *lo, int64_t *hi) {
  *lo = a > from ? a : from;
  *hi = a + n < from + len ? a + n : from + len;
  return *hi > *lo;
}

/* Bytes of one moment value: 4, or 2 under train.moments = bf16. */
static int moment_size(const TrainCtx *ctx) { return ctx->art->optim.moments16 ? 2 : 4; }

/* A device range (zown values: moments, or at ZeRO 3 the parameters)
 * between this member's units and the loop's owned range of its pool
 * (TrainShards): the orders differ (the device's is the stage module's by
 * unit, the loop's the manifest's), so one side's ranges are gathered over
 * dp on the host and each member takes its own from them. Checkpoints and
 * resuming only. */
static int zero_convert(CudaProg *P, TrainCtx *ctx, void *dev_range, int bf16, float *pool, int to_host, RtErr *e) {
  const TrainShards *sh = ctx->shards;
  Device *d = P->dev;
  int me = ctx->comm->rank[COMM_DP];
  if (to_host) {
    if (bf16 ? dev_copy_bf16(d, dev_range, P->zhost + P->zlen, P->zown, 0)
             : d->ops->to_host(d, P->zhost + P->zlen, dev_range, sizeof(float) * (size_t)P->zown))
      return fail(e, "%s", dev_error(d));
    if (comm_all_gather(ctx->comm, COMM_DP, COMM_F32, P->zhost + P->zlen, P->zown, P->zhost, e) < 0) return -1;
    for (int i = 0; i < ctx->ntensors; i++) {
      int64_t lo, hi, run;
      if (P->use_of[i] < 0) continue; /* another chunk's (virtual stages) */
      const CudaUse *c = &P->uses[P->use_of[i]];
      int64_t a = devx_flat_index(P->x, c->param, c->layer);
      if (unit_of(P, a) < 0) continue; /* kept apart: whole (expert_convert, state_convert) */
      if (!overlap_of(sh->offset[i], c->numel, sh->own_lo, sh->own_len, &lo, &hi)) continue;
      for (int64_t j = lo; j < hi; j += run) {
        int64_t at = gathered_at(P, a + (j - sh->offset[i]), &run);
        if (run > hi - j) run = hi - j;
        memcpy(pool + (j - sh->own_lo), P->zhost + at, sizeof(float) * (size_t)run);
      }
    }
    return 0;
  }
  float *whole = malloc(sizeof(float) * (size_t)(sh->pool_cap ? sh->pool_cap : 1));
  if (!whole) return fail(e, "out of memory");
  int rc = comm_all_gather(ctx->comm, COMM_DP, COMM_F32, pool, sh->own_len, whole, e) < 0 ? -1 : 0;
  memset(P->zhost, 0, sizeof(float) * (size_t)P->zown);
  for (int i = 0; i < ctx->ntensors && !rc; i++) {
    int64_t run;
    if (P->use_of[i] < 0) continue; /* another chunk's (virtual stages) */
    const CudaUse *c = &P->uses[P->use_of[i]];
    int64_t a = devx_flat_index(P->x, c->param, c->layer);
    if (unit_of(P, a) < 0) continue; /* kept apart: whole (expert_convert, state_convert) */
    for (int64_t q = a; q < a + c->numel; q += run) {
      int64_t at = gathered_at(P, q, &run);
      if (run > a + c->numel - q) run = a + c->numel - q;
      if (at / P->zown == me) memcpy(P->zhost + at % P->zown, whole + sh->offset[i] + (q - a), sizeof(float) * (size_t)run);
    }
  }
  free(whole);
  if (!rc && (bf16 ? dev_copy_bf16(d, dev_range, P->zhost, P->zown, 1)
                   : d->ops->to_device(d, dev_range, P->zhost, sizeof(float) * (size_t)P->zown)))
    rc = fail(e, "%s", dev_error(d));
  return rc;
}

/* Use c is an expert tensor kept apart from the units, whole on the device
 * (DevxFlat.experts_apart; running statistics aside). */
static int expert_apart(const CudaProg *P, const CudaUse *c) {
  return c->t && !c->t->param->state && train_tensor_is_expert(c->t) && unit_of(P, devx_flat_index(P->x, c->param, c->layer)) < 0;
}

/* The experts' tensors, whole on the device, and the loop's pools, which
 * hold this member's slice of the expert region ([own2_lo, own2_lo +
 * own2_len), owned over edp, after the own_len values): which 0, 1 the
 * moments (of whole tensors, or xsliced of this member's slices: the
 * loop's own), 2 the parameters (ZeRO 3's master). */
static int expert_convert(CudaProg *P, TrainCtx *ctx, int which, float *pool, int to_host, RtErr *e) {
  const TrainShards *sh = ctx->shards;
  if (sh->own2_len <= 0) return 0;
  int64_t region = sh->pool_cap - sh->expert_lo, largest = 1;
  for (int q = 0; q < P->nuses; q++)
    if (P->uses[q].numel > largest) largest = P->uses[q].numel;
  int sliced = which < 2 && P->xsliced; /* the moments are the loop's slices already */
  float *all = to_host || sliced ? NULL : malloc(sizeof(float) * (size_t)(region > 0 ? region : 1));
  float *buf = malloc(sizeof(float) * (size_t)largest);
  int rc = !buf || (!to_host && !sliced && !all) ? fail(e, "out of memory") : 0;
  if (!rc && !to_host && !sliced && comm_all_gather(ctx->comm, COMM_EDP, COMM_F32, pool + sh->own_len, sh->own2_len, all, e) < 0)
    rc = -1;
  for (int k = 0; k < (which < 2 ? P->nent : ctx->ntensors) && !rc; k++) {
    int i = which < 2 ? P->ent_tensor[k] : k;
    if (which < 2 ? !P->ent_expert[k] : P->use_of[i] < 0 || !expert_apart(P, &P->uses[P->use_of[i]])) continue;
    const CudaUse *c = &P->uses[P->use_of[i]];
    if (sliced) { /* this member's slice, as the loop's */
      int64_t n = P->ent_n[k];
      if (!to_host) memcpy(buf, pool + sh->own_len + P->ent_at[k], sizeof(float) * (size_t)n);
      if (devopt_moment(P->opt, k, which, buf, !to_host)) rc = fail(e, "%s", devopt_error(P->opt));
      else if (to_host) memcpy(pool + sh->own_len + P->ent_at[k], buf, sizeof(float) * (size_t)n);
    } else if (to_host) {
      int64_t lo, hi;
      if (which < 2 ? devopt_moment(P->opt, k, which, buf, 0) : devx_get_param_copy(P->x, c->param, c->layer, buf))
        rc = fail(e, "%s", which < 2 ? devopt_error(P->opt) : devx_error(P->x));
      else if (overlap_of(sh->offset[i], c->numel, sh->own2_lo, sh->own2_len, &lo, &hi))
        memcpy(pool + sh->own_len + (lo - sh->own2_lo), buf + (lo - sh->offset[i]), sizeof(float) * (size_t)(hi - lo));
    } else {
      memcpy(buf, all + (sh->offset[i] - sh->expert_lo), sizeof(float) * (size_t)c->numel);
      if (which < 2 ? devopt_moment(P->opt, k, which, buf, 1) : devx_set_param_copy(P->x, c->param, c->layer, buf))
        rc = fail(e, "%s", which < 2 ? devopt_error(P->opt) : devx_error(P->x));
    }
  }
  free(all);
  free(buf);
  return rc;
}

/* xsliced, after the update: each member's updated slices of the experts
 * (the loop's expert region, [own2_lo, own2_lo + own2_len)) to the other
 * members holding the same experts (edp), so that each holds them whole
 * again: packed in region order on the device, all-gathered (NCCL on the
 * device, else through host memory), each tensor copied out whole. */
static int expert_gather(CudaProg *P, TrainCtx *ctx, RtErr *e) {
  const TrainShards *sh = ctx->shards;
  if (!P->xsliced) return 0;
  Device *d = P->dev;
  int64_t region = sh->pool_cap - sh->expert_lo;
  size_t obytes = sizeof(float) * (size_t)sh->own2_len, abytes = sizeof(float) * (size_t)region;
  float *own = devx_buffer(P->x, obytes), *all = own ? devx_buffer(P->x, abytes) : NULL;
  float *hown = NULL, *hall = NULL;
  int rc = !all ? fail(e, "%s", devx_error(P->x)) : 0;
  for (int k = 0; k < P->nent && !rc; k++) {
    if (P->ent_expert[k] != ENT_EXPERT_SLICE) continue;
    int i = P->ent_tensor[k];
    const CudaUse *c = &P->uses[P->use_of[i]];
    const float *slice = (const float *)devx_param_ptr(P->x, c->param, c->layer) + (sh->own2_lo + P->ent_at[k] - sh->offset[i]);
    if (d->ops->copy(d, own + P->ent_at[k], slice, sizeof(float) * (size_t)P->ent_n[k])) rc = fail(e, "%s", dev_error(d));
  }
  if (!rc && P->dcomm) {
    comm_nccl_set_stream(P->dcomm, NULL);
    if (comm_all_gather(P->dcomm, COMM_EDP, COMM_F32, own, sh->own2_len, all, e) < 0) rc = -1;
  } else if (!rc) {
    hown = malloc(obytes);
    hall = malloc(abytes);
    if (!hown || !hall) rc = fail(e, "out of memory");
    else if (d->ops->to_host(d, hown, own, obytes)) rc = fail(e, "the experts' slices to the host: %s", dev_error(d));
    else if (comm_all_gather(ctx->comm, COMM_EDP, COMM_F32, hown, sh->own2_len, hall, e) < 0) rc = -1;
    else if (d->ops->to_device(d, all, hall, abytes)) rc = fail(e, "the experts to the device: %s", dev_error(d));
  }
  for (int q = 0; q < P->nuses && !rc; q++) {
    const CudaUse *c = &P->uses[q];
    if (!expert_apart(P, c)) continue;
    int i = (int)(c->t - ctx->tensors);
    if (d->ops->copy(d, devx_param_ptr(P->x, c->param, c->layer), all + (sh->offset[i] - sh->expert_lo),
                     sizeof(float) * (size_t)c->numel))
      rc = fail(e, "%s", dev_error(d));
  }
  free(hown);
  free(hall);
  if (own) devx_buffer_put(P->x, own, obytes);
  if (all) devx_buffer_put(P->x, all, abytes);
  return rc;
}

/* ZeRO 3: the running statistics, kept apart and whole on the device, and
 * the loop's owned master slice (the dense region's [own_lo, own_lo +
 * own_len)): out, this member's part of each; in, the slices gathered over
 * dp into whole tensors. */
static int state_convert(CudaProg *P, TrainCtx *ctx, int to_host, RtErr *e) {
  const TrainShards *sh = ctx->shards;
  int64_t largest = 0;
  for (int i = 0; i < ctx->ntensors; i++)
    if (P->use_of[i] >= 0 && ctx->tensors[i].param->state && P->uses[P->use_of[i]].numel > largest) largest = P->uses[P->use_of[i]].numel;
  if (!largest) return 0;
  /* what the all-gather writes: every member's owned slice (the dense
   * region, padded; with experts apart, expert_lo = own_len x dp; with the
   * experts in the units, expert_lo is where they begin, not the end) */
  int64_t dense = sh->own_len * ctx->comm->size[COMM_DP];
  float *buf = malloc(sizeof(float) * (size_t)largest), *all = to_host ? NULL : malloc(sizeof(float) * (size_t)(dense ? dense : 1));
  int rc = !buf || (!to_host && !all) ? fail(e, "out of memory") : 0;
  if (!rc && !to_host && comm_all_gather(ctx->comm, COMM_DP, COMM_F32, sh->master, sh->own_len, all, e) < 0) rc = -1;
  for (int i = 0; i < ctx->ntensors && !rc; i++) {
    if (P->use_of[i] < 0 || !ctx->tensors[i].param->state) continue;
    const CudaUse *c = &P->uses[P->use_of[i]];
    if (to_host) {
      int64_t lo, hi;
      if (devx_get_param_copy(P->x, c->param, c->layer, buf)) rc = fail(e, "%s", devx_error(P->x));
      else if (overlap_of(sh->offset[i], c->numel, sh->own_lo, sh->own_len, &lo, &hi))
        memcpy(sh->master + (lo - sh->own_lo), buf + (lo - sh->offset[i]), sizeof(float) * (size_t)(hi - lo));
    } else if (devx_set_param_copy(P->x, c->param, c->layer, all + sh->offset[i]))
      rc = fail(e, "%s", devx_error(P->x));
  }
  free(buf);
  free(all);
  return rc;
}

/* The moments (and at ZeRO 3 the parameters) between device and loop. */
static int zero_state(CudaProg *P, TrainCtx *ctx, int to_host, RtErr *e) {
  const TrainShards *sh = ctx->shards;
  int m16 = ctx->art->optim.moments16;
  if (P->zm && sh->m && zero_convert(P, ctx, P->zm, m16, sh->m, to_host, e)) return prefix(e, "the first moments");
  if (P->zv && sh->v && zero_convert(P, ctx, P->zv, m16, sh->v, to_host, e)) return prefix(e, "the second moments");
  if (P->zero >= 3 && zero_convert(P, ctx, P->zp, 0, sh->master, to_host, e)) return prefix(e, "the parameters' slices");
  if (sh->m && expert_convert(P, ctx, 0, sh->m, to_host, e)) return prefix(e, "the experts' first moments");
  if (sh->v && expert_convert(P, ctx, 1, sh->v, to_host, e)) return prefix(e, "the experts' second moments");
  if (P->zero >= 3 && expert_convert(P, ctx, 2, sh->master, to_host, e)) return prefix(e, "the experts' parameters");
  if (P->zero >= 3 && state_convert(P, ctx, to_host, e)) return prefix(e, "the running statistics");
  return 0;
}

/* ZeRO: the experts' gradients (kept whole, apart from the units) summed
 * over the ranks holding the same experts (edp) after the step: NCCL on
 * the device, else through the loop's gradient pool in host memory. */
static int expert_sums(CudaProg *P, TrainCtx *ctx, RtErr *e) {
  if (ctx->comm->size[COMM_EDP] <= 1) return 0;
  int rc = P->dcomm ? comm_group(P->dcomm, 1, e) : 0;
  for (int i = 0; i < P->nuses && !rc; i++) {
    const CudaUse *c = &P->uses[i];
    if (!c->t || unit_of(P, devx_flat_index(P->x, c->param, c->layer)) >= 0 || !train_tensor_is_expert(c->t)) continue;
    if (P->dcomm) rc = comm_all_reduce(P->dcomm, COMM_EDP, COMM_F32, COMM_SUM, devx_grad_ptr(P->x, c->param, c->layer), c->numel, e);
    else if (devx_get_grad_copy(P->x, c->param, c->layer, c->t->grad)) rc = fail(e, "%s", devx_error(P->x));
    else if (ctx->comm->ops->all_reduce(ctx->comm, COMM_EDP, COMM_F32, COMM_SUM, c->t->grad, c->numel, e) < 0) rc = -1;
    else if (devx_set_grad_copy(P->x, c->param, c->layer, c->t->grad)) rc = fail(e, "%s", devx_error(P->x));
  }
  RtErr ge;
  if (P->dcomm && comm_group(P->dcomm, 0, &ge) && !rc) rc = fail(e, "%s", ge.msg);
  return rc;
}

/* Under ZeRO (ctx->shards): this member's ranges, its moments (and at
 * ZeRO 3 its parameters and reduced gradients), and the optimizer's
 * entries (each tensor's owned part; running statistics are not updated);
 * 0, or -1 with why the update stays on the host. */
static int zero_setup(CudaProg *P, TrainCtx *ctx, DevOptTensor **out, char *why, size_t whylen) {
  const TrainShards *sh = ctx->shards;
  Device *d = P->dev;
  if (sh->zero >= 3 && !sh->master) {
    snprintf(why, whylen, "ZeRO-3 on the device does not run without the runtime's parameter slices");
    return -1;
  }
  const OptimConfig *oc = &ctx->art->optim;
  int want_m = oc->kind == OPTIM_ADAMW || oc->momentum != 0, want_v = oc->kind == OPTIM_ADAMW;
  void *pb, *gb;
  P->dp = ctx->comm->size[COMM_DP];
  P->zlen = devx_flat(P->x, &pb, &gb);
  P->nunits = devx_units(P->x, &P->ustart);
  P->zoff = calloc((size_t)P->nunits + 1, sizeof(int64_t));
  P->ubuf = calloc((size_t)P->nunits + 1, sizeof(void *));
  P->uref = calloc((size_t)P->nunits + 1, sizeof(int));
  P->uleft = calloc((size_t)P->nunits + 1, sizeof(int));
  P->uleft0 = calloc((size_t)P->nunits + 1, sizeof(int));
  P->ulate = calloc((size_t)P->nunits + 1, 1);
  P->ureduced = calloc((size_t)P->nunits + 1, 1);
  if (!P->zoff || !P->ubuf || !P->uref || !P->uleft || !P->uleft0 || !P->ulate || !P->ureduced) {
    snprintf(why, whylen, "out of memory");
    return -1;
  }
  P->dprank = ctx->comm->rank[COMM_DP];
  P->zown = 0;
  for (int u = 0; u < P->nunits; u++) P->zoff[u] = P->zown, P->zown += unit_own(P, u);
  P->msize = moment_size(ctx);
  size_t bytes = sizeof(float) * (size_t)(P->zown ? P->zown : 1), mbytes = (size_t)P->msize * (size_t)(P->zown ? P->zown : 1);
  int z3 = sh->zero >= 3, z2 = sh->zero >= 2;
  P->ugrad = calloc((size_t)P->nunits + 1, sizeof(void *));
  P->ugref = calloc((size_t)P->nunits + 1, sizeof(int));
  P->uadd = calloc((size_t)P->nunits + 1, 1);
  P->retired = calloc((size_t)P->nunits + 1, sizeof(void *));
  P->retired_bytes = calloc((size_t)P->nunits + 1, sizeof(size_t));
  if (!P->ugrad || !P->ugref || !P->uadd || !P->retired || !P->retired_bytes) {
    snprintf(why, whylen, "out of memory");
    return -1;
  }
  if ((want_m && !(P->zm = d->ops->alloc(d, mbytes))) || (want_v && !(P->zv = d->ops->alloc(d, mbytes))) ||
      (z3 && !(P->zp = d->ops->alloc(d, bytes))) || (z2 && (!(P->zg = d->ops->alloc(d, bytes)) || !(P->zt = d->ops->alloc(d, bytes)))) ||
      (P->zm && d->ops->zero(d, P->zm, mbytes)) || (P->zv && d->ops->zero(d, P->zv, mbytes)) || (P->zp && d->ops->zero(d, P->zp, bytes)) ||
      (P->zg && d->ops->zero(d, P->zg, bytes)) || (P->zt && d->ops->zero(d, P->zt, bytes))) {
    snprintf(why, whylen, "this rank's ranges: %s", dev_error(d));
    return -1;
  }
  P->zhost = malloc(sizeof(float) * (size_t)(P->zlen + P->zown + 1));
  DevOptTensor *t = calloc((size_t)ctx->ntensors * (size_t)P->nunits + 1, sizeof *t);
  P->ent_tensor = calloc((size_t)ctx->ntensors + 1, sizeof(int));
  P->ent_expert = calloc((size_t)ctx->ntensors + 1, 1);
  P->ent_at = calloc((size_t)ctx->ntensors + 1, sizeof(int64_t));
  P->ent_n = calloc((size_t)ctx->ntensors + 1, sizeof(int64_t));
  const char *xstate = getenv("HPDL_EXPERT_STATE");
  P->xsliced = sh->own2_len > 0 && ctx->comm->size[COMM_EDP] > 1 && !(xstate && !strcmp(xstate, "whole"));
  if (!P->zhost || !t || !P->ent_tensor || !P->ent_expert || !P->ent_at || !P->ent_n) {
    free(t);
    snprintf(why, whylen, "out of memory");
    return -1;
  }
  P->nent = 0;
  for (int i = 0; i < ctx->ntensors; i++) {
    if (P->use_of[i] < 0) continue; /* another chunk's (virtual stages) */
    const CudaUse *c = &P->uses[P->use_of[i]];
    int64_t a = devx_flat_index(P->x, c->param, c->layer), lo, hi;
    int u = unit_of(P, a);
    if (u < 0) { /* an expert's, kept whole, its sum over edp after the step: updated whole, its moments the optimizer's,
                  * or (xsliced) the slice of it this member owns in the loop's expert region, all-gathered after */
      if (ctx->tensors[i].param->state) continue;
      int64_t from = 0, n = c->numel;
      if (P->xsliced) {
        if (!overlap_of(sh->offset[i], c->numel, sh->own2_lo, sh->own2_len, &lo, &hi)) continue;
        from = lo - sh->offset[i];
        n = hi - lo;
        P->ent_at[P->nent] = lo - sh->own2_lo;
        P->ent_n[P->nent] = n;
      }
      t[P->nent] = (DevOptTensor){(float *)devx_param_ptr(P->x, c->param, c->layer) + from,
                                  (float *)devx_grad_ptr(P->x, c->param, c->layer) + from, n, ctx->tensors[i].param->weight_decay,
                                  NULL, NULL};
      P->ent_expert[P->nent] = P->xsliced ? ENT_EXPERT_SLICE : ENT_EXPERT_WHOLE;
      P->ent_tensor[P->nent++] = i;
      continue;
    }
    int64_t os = unit_own_start(P, u);
    if (ctx->tensors[i].param->state || !overlap_of(a, c->numel, os, unit_own(P, u), &lo, &hi)) continue;
    int64_t at = P->zoff[u] + (lo - os); /* in the ranges */
    t[P->nent] = (DevOptTensor){z3 ? (float *)P->zp + at : (float *)pb + lo, z2 ? (float *)P->zg + at : (float *)gb + lo, hi - lo,
                                ctx->tensors[i].param->weight_decay, P->zm ? (char *)P->zm + at * P->msize : NULL,
                                P->zv ? (char *)P->zv + at * P->msize : NULL};
    P->ent_tensor[P->nent++] = i;
  }
  /* NCCL: a stream of its own for the reduce-scatters as the backward
   * finishes each unit's gradients (ZeRO 1: the last micro-batch's, found
   * by the grad-ready hook; ZeRO 2, 3: each micro-batch's, by the layer
   * hook, on rstream) and ZeRO 3's gathers of the next layer; the copies
   * per unit that get a gradient (running statistics get none), and the
   * units holding a tied copy (summed on the host after the step) */
  const char *off = getenv("HPDL_OVERLAP");
  if (P->dcomm && P->dev->ops->stream_create && !(off && !strcmp(off, "0"))) {
    P->cstream = P->dev->ops->stream_create(P->dev);
    if (z2 && P->cstream && !(P->rstream = P->dev->ops->stream_create(P->dev))) {
      snprintf(why, whylen, "a stream for the reduce-scatters: %s", dev_error(d));
      return -1;
    }
  }
  const IrModule *mod = P->pc->m;
  for (int q = 0; q < mod->nparams; q++)
    for (int64_t k = 0; k < ir_param_copies(&mod->params[q]); k++)
      if (!mod->params[q].state && unit_of(P, devx_flat_index(P->x, q, k)) >= 0) P->uleft0[unit_of(P, devx_flat_index(P->x, q, k))]++;
  for (int u = 0; u < P->nuses; u++) {
    int un = unit_of(P, devx_flat_index(P->x, P->uses[u].param, P->uses[u].layer));
    if (un >= 0 && (!P->uses[u].t || P->uses[u].u->nmirrors > 0)) P->ulate[un] = 1;
  }
  if (!z2 && P->cstream && devx_set_grad_ready(P->x, zero_grad_ready, P)) {
    snprintf(why, whylen, "%s", devx_error(P->x));
    return -1;
  }
  if (z3 && gather16_setup(P, why, whylen)) return -1;
  if (z2) { /* the gradients' block goes (ZeRO 3: the parameters' too); the units come as the step reaches them */
    devx_release_grads(P->x);
    if (z3) devx_release_params(P->x);
    devx_set_layer_hook(P->x, zero_layer, P);
  }
  *out = t;
  return 0;
}

/* A chunk's part of the step before the tied parameters' values come:
 * ZeRO's buffers for the step (ZeRO 3: the unrepeated unit gathered). */
static int step_open(CudaProg *P, TrainCtx *ctx, int nmicro, RtErr *e) {
  Device *d = P->dev;
  P->nmicro = nmicro;
  P->tctx = ctx;
  if (P->zero >= 2) { /* the step's sums start at zero; the unrepeated parameters' gradients in a buffer for the step */
    RtErr ge;
    size_t zb = sizeof(float) * (size_t)(P->zown ? P->zown : 1);
    if (d->ops->zero(d, P->zg, zb)) return fail(e, "%s", dev_error(d));
    if (P->ugrad[0] ? d->ops->zero(d, P->ugrad[0], sizeof(float) * (size_t)(P->ustart[1] - P->ustart[0] + 1)) : grad_open(P, 0, &ge))
      return fail(e, "%s", P->ugrad[0] ? dev_error(d) : ge.msg);
    P->ugref[0] = 1;
  }
  if (P->zero >= 3 && !P->ubuf[0]) {
    char why[1000];
    if (unit_gather(P, ctx, 0, why, sizeof why)) return fail(e, "%s", why);
    P->uref[0] = 1;
    if (P->cstream && d->ops->stream_wait(d, NULL, P->cstream)) return fail(e, "%s", dev_error(d));
  }
  return 0;
}

/* After the tied values: the parameters in (not resident), the bf16
 * copies, the gradients zeroed, the step's counters reset. */
static int step_begin(CudaProg *P, TrainCtx *ctx, RtErr *e) {
  for (int i = 0; i < P->nuses && !P->resident; i++) {
    const CudaUse *c = &P->uses[i];
    if (devx_set_param_copy(P->x, c->param, c->layer, c->t ? c->t->data : c->mirror)) return fail(e, "%s", devx_error(P->x));
  }
  if (devx_refresh16(P->x) || devx_zero_grads(P->x)) return fail(e, "%s", devx_error(P->x));
  devx_set_evaluating(P->x, ctx->eval);
  double aux = 0;
  devx_take_aux(P->x, &aux); /* nothing from before this step */
  if (P->reduced) memset(P->reduced, 0, (size_t)P->nuses);
  if (P->zero) {
    memset(P->ureduced, 0, (size_t)P->nunits);
    memcpy(P->uleft, P->uleft0, sizeof(int) * (size_t)P->nunits);
  }
  P->nbucket = 0;
  P->bucket_bytes = 0;
  return 0;
}

/* After the micro-batches, before the tied gradients go: the gradients
 * out (not resident), the running statistics. */
static int step_end(CudaProg *P, TrainCtx *ctx, RtErr *e) {
  for (int i = 0; i < P->nuses && !P->resident; i++) {
    const CudaUse *c = &P->uses[i];
    if (!c->t) continue; /* a mirror's gradient goes to its owner (tie) */
    if (devx_get_grad_copy(P->x, c->param, c->layer, P->host)) return fail(e, "%s", devx_error(P->x));
    for (int64_t k = 0; k < c->numel; k++) c->t->grad[k] += P->host[k];
    /* running statistics the forwards updated on the device: back to the loop's tensor */
    if (P->pc->m->params[c->param].state && devx_get_param_copy(P->x, c->param, c->layer, c->t->data))
      return fail(e, "%s", devx_error(P->x));
  }
  /* resident on dp > 1 members: data-parallel member 0's running statistics
   * to the others (the loop's sync_state, which does not see the device's) */
  for (int i = 0; i < P->nuses && P->resident && ctx->comm->size[COMM_DP] > 1; i++) {
    const CudaUse *c = &P->uses[i];
    if (!c->t || !P->pc->m->params[c->param].state) continue;
    if (devx_get_param_copy(P->x, c->param, c->layer, c->t->data)) return fail(e, "%s", devx_error(P->x));
    if (comm_broadcast(ctx->comm, COMM_DP, COMM_F32, c->t->data, c->numel, 0, e) < 0) return -1;
    if (devx_set_param_copy(P->x, c->param, c->layer, c->t->data)) return fail(e, "%s", devx_error(P->x));
  }
  return 0;
}

/* After the tied gradients came: resident on dp > 1 members, the
 * gradients' sum over dp (an expert shard's over the ranks holding its
 * experts, edp): by NCCL on the device, overlapped with the backward (what
 * is left of it here) or all after it; without NCCL through the loop's
 * gradient pool (the tensors' grad, idle in this mode) in host memory. */
static int step_close(CudaProg *P, TrainCtx *ctx, RtErr *e) {
  Device *d = P->dev;
  if (P->zero) {
    if (!ctx->eval && (zero_reduce(P, ctx, e) || expert_sums(P, ctx, e))) return -1;
    /* ZeRO 3: the units back (a gather still running first; the launches reading them run before any reuse: one stream) */
    if (P->zero >= 3 && P->cstream && d->ops->stream_wait(d, NULL, P->cstream)) return fail(e, "%s", dev_error(d));
    for (int u = 0; P->zero >= 3 && u < P->nunits; u++) unit_release(P, u);
  } else if (P->resident && ctx->comm->size[COMM_DP] > 1 && P->dcomm) {
    /* what the backward did not start (the first step, tied copies, the last
     * bucket; with no overlap everything), then the launches wait */
    if (flush_bucket(P, e) || sum_uses(P, NULL, 0, e)) return -1;
    if (P->cstream && d->ops->stream_wait(d, NULL, P->cstream)) return fail(e, "%s", dev_error(d));
  } else if (P->resident && ctx->comm->size[COMM_DP] > 1) {
    for (int i = 0; i < P->nuses; i++) {
      const CudaUse *c = &P->uses[i];
      if (!c->t) continue; /* a mirror's gradient went to its owner */
      CommGroup over = dp_group_of(c);
      if (ctx->comm->size[over] <= 1) continue;
      if (compressed(P, c)) { /* on the device, the exchange through host memory */
        int members = ctx->comm->size[COMM_DP];
        CompWay cw = {P, ctx->comm, COMM_DP, 0};
        if (devz_batch(P->comp, devz_all_reduce_bytes(c->numel, members, comp_rs(members))))
          return fail(e, "%s", devz_error(P->comp));
        if (comp_use(P, &cw, NULL, i, e)) return -1;
        continue;
      }
      if (devx_get_grad_copy(P->x, c->param, c->layer, c->t->grad)) return fail(e, "%s", devx_error(P->x));
      if (ctx->comm->ops->all_reduce(ctx->comm, over, COMM_F32, COMM_SUM, c->t->grad, c->numel, e) < 0) return -1;
      if (devx_set_grad_copy(P->x, c->param, c->layer, c->t->grad)) return fail(e, "%s", devx_error(P->x));
    }
  }
  return 0;
}

static int cuda_step(void *self, TrainCtx *ctx, const DataBatch *const *micro, int nmicro, double *loss, int *has_loss, RtErr *e) {
  CudaStage *S = self;
  CudaProg *P = S->c[0];
  Device *d = P->dev;
  double t0 = P->timing ? d->ops->seconds(d) : 0, t1;
  /* the parameters are in (resident: as the last update left them, or a resumed checkpoint);
   * ZeRO 3: the unrepeated ones gathered for the step (before the tied ones' values come), the
   * layers' as they run */
  for (int c = 0; c < S->n; c++)
    if (step_open(S->c[c], ctx, nmicro, e)) return -1;
  if (S->pp > 1 && stage_tie(S, 0, e)) return prefix(e, "the tied parameters' values");
  for (int c = 0; c < S->n; c++)
    if (step_begin(S->c[c], ctx, e)) return -1;
  if (P->timing) {
    t1 = d->ops->seconds(d);
    P->t_params += t1 - t0;
    t0 = t1;
  }
  double total = 0;
  if (S->pp > 1) {
    if (run_pipeline(S, ctx, micro, nmicro, &total, e)) return -1;
    if (P->timing) {
      t1 = d->ops->seconds(d);
      P->t_micro += t1 - t0;
      t0 = t1;
    }
  }
  for (int j = 0; j < nmicro && S->pp == 1; j++) {
    if (set_inputs(P, micro[j], e)) return -1;
    float l = 0;
    if (P->timing) {
      t1 = d->ops->seconds(d);
      P->t_inputs += t1 - t0;
      t0 = t1;
    }
    double pt = P->pf ? P->pf->now(P->pf->self) : 0;
    P->cur_mb = j;
    devx_micro_begin(P->x, j == nmicro - 1 && !ctx->eval);
    if (devx_step(P->x, P->pc->step, (float)ctx->grad_scale, &l) || devx_micro_end(P->x)) return fail(e, "%s", devx_error(P->x));
    if (P->pf) P->pf->span(P->pf->self, "forward+backward", "step", pt, P->pf->now(P->pf->self), j, P->pc->chunk, -1, 0, 0);
    if (P->timing) {
      t1 = d->ops->seconds(d);
      P->t_micro += t1 - t0;
      t0 = t1;
    }
    if (comm_ring_finish(&P->ring, e)) return -1;
    total += l;
  }
  for (int c = 0; c < S->n; c++)
    if (step_end(S->c[c], ctx, e)) return -1;
  if (S->pp > 1 && stage_tie(S, 1, e)) return prefix(e, "the tied parameters' gradients");
  for (int c = 0; c < S->n; c++)
    if (step_close(S->c[c], ctx, e)) return -1;
  if (P->timing) {
    P->t_grads += d->ops->seconds(d) - t0;
    P->steps++;
    if (P->launch_top && P->steps == 1) /* the first step (modules, cuBLASLt's choices) left out */
      for (int c = 0; c < S->n; c++) devx_profile(S->c[c]->x, 1);
  }
  *has_loss = S->pp == 1 || S->stage == S->pp - 1;
  *loss = total / (double)nmicro;
  /* the auxiliary losses the step's forwards ran (as the CPU program's) */
  double aux = 0;
  ctx->has_aux = 0;
  for (int c = 0; c < S->n; c++) {
    double a = 0;
    if (devx_take_aux(S->c[c]->x, &a)) ctx->has_aux = 1, aux += a;
  }
  ctx->aux_loss = ctx->has_aux ? aux / (double)nmicro : 0;
  return 0;
}

/* ---- resident: parameters, gradients and the optimizer on the device ---- */

/* The moments a resident chunk keeps per value: AdamW 2, SGD with momentum 1. */
static int moments_of(const TrainCtx *ctx) {
  const OptimConfig *oc = &ctx->art->optim;
  return oc->kind == OPTIM_ADAMW ? 2 : oc->momentum != 0 ? 1 : 0;
}

/* The start-up lines' name of the optimizer's state. */
static const char *state_name(const TrainCtx *ctx) {
  const OptimConfig *oc = &ctx->art->optim;
  return oc->kind == OPTIM_ADAMW ? (oc->moments16 ? "AdamW (bf16 moments)" : "AdamW") : (oc->moments16 ? "SGD (bf16 momentum)" : "SGD");
}

/* MB a rank of a resident chunk's parameters, gradients and moments (the
 * start-up line): under ZeRO its blocks and ranges, else its tensors whole. */
static double resident_mb(const CudaProg *P, const TrainCtx *ctx) {
  double mom = (double)moments_of(ctx) * moment_size(ctx); /* bytes a value */
  if (P->zero >= 3) return (double)P->zown * (3 * 4.0 + mom) / 1e6;
  if (P->zero == 2) return ((double)P->zlen * 4.0 + (double)P->zown * (2 * 4.0 + mom)) / 1e6;
  if (P->zero) return ((double)P->zlen * 2 * 4.0 + (double)P->zown * mom) / 1e6;
  int64_t n = 0;
  for (int i = 0; i < ctx->ntensors; i++)
    if (P->use_of[i] >= 0) n += ctx->tensors[i].numel;
  return (double)n * (2 * 4.0 + mom) / 1e6;
}

/* The start-up line's word on the gradients' sum over dp without ZeRO. */
static const char *dp_sum_words(const CudaProg *P, const TrainCtx *ctx) {
  return ctx->comm->size[COMM_DP] <= 1 ? ""
         : P->cstream                  ? "; the gradients' sum over dp by NCCL on a stream of its own, bucket by bucket as the backward finishes them"
         : P->dcomm                    ? "; the gradients' sum over dp by NCCL on the device"
                                       : "; the gradients' sum over dp goes through host memory";
}

/* The artifact's compression, where the gradients go compressed over dp:
 * COMM_COMPRESS_NONE where they do not. */
static CommCompressKind compression_of(const TrainCtx *ctx) {
  return ctx->comm->size[COMM_DP] > 1 ? ctx->art->compression : COMM_COMPRESS_NONE;
}

/* A resident chunk's compressed sums (P->comp), with error feedback's
 * residual for each value its sums compress: ZeRO's by flat place, else
 * use by use. 0, or -1 with why. */
static int comp_setup(CudaProg *P, TrainCtx *ctx, char *err, size_t errlen) {
  CommCompressKind kind = compression_of(ctx);
  if (kind == COMM_COMPRESS_NONE) return 0;
  int64_t n = 0;
  if (ctx->shards) { /* ZeRO (set up after this): by flat place */
    const int64_t *start;
    int units = devx_units(P->x, &start);
    n = start[units];
  } else {
    if (!(P->comp_at = calloc((size_t)P->nuses + 1, sizeof(int64_t)))) return snprintf(err, errlen, "out of memory"), -1;
    for (int u = 0; u < P->nuses; u++)
      if (P->uses[u].t && dp_group_of(&P->uses[u]) == COMM_DP) P->comp_at[u] = n, n += P->uses[u].numel;
  }
  if (!(P->comp = devz_new(P->dev, kind == COMM_COMPRESS_BF16, ctx->art->error_feedback ? n : 0, err, errlen))) return -1;
  snprintf(P->zwords, sizeof P->zwords, "; the gradients rounded to %s on the device for their sum%s", comm_compress_name(kind),
           ctx->art->error_feedback ? ", error feedback's residual kept there" : "");
  return 0;
}

/* The start-up line's words on the compressed sums. */
static const char *comp_words(const CudaProg *P) { return P->comp ? P->zwords : ""; }

/* A chunk's tensors and optimizer on the device. Every loop tensor must be
 * read by exactly one use of the chunk (a tensor no use reads would never
 * be updated); one_of: the stage runs several chunks (virtual stages), each
 * holding some of the loop's tensors: the chunk's optimizer takes those
 * (entries ent_tensor[0..nent)) and the stage says what it did. */
static int chunk_resident(CudaProg *P, TrainCtx *ctx, int one_of) {
  char why[1200];
  if (comp_setup(P, ctx, why, sizeof why)) {
    if (ctx->comm->world_rank == 0) fprintf(stderr, "hpdlrun: the optimizer stays on the host: %s\n", why);
    return 0;
  }
  P->use_of = calloc((size_t)ctx->ntensors + 1, sizeof(int));
  P->sums = calloc((size_t)ctx->ntensors + 1, sizeof(double));
  DevOptTensor *t = calloc((size_t)ctx->ntensors + 1, sizeof *t);
  if (!P->use_of || !P->sums || !t) {
    free(t);
    return 0;
  }
  for (int i = 0; i < ctx->ntensors; i++) P->use_of[i] = -1;
  int ok = 1;
  for (int u = 0; u < P->nuses && ok; u++) {
    if (!P->uses[u].t) continue; /* a mirror: its values come from the owner's stage each step (tie) */
    int i = (int)(P->uses[u].t - ctx->tensors);
    if (P->use_of[i] >= 0) ok = 0; /* two uses of one tensor */
    P->use_of[i] = u;
  }
  int nt = 0;
  if (one_of && ok && !ctx->shards && !(P->ent_tensor = calloc((size_t)ctx->ntensors + 1, sizeof(int)))) ok = 0;
  for (int i = 0; i < ctx->ntensors && ok; i++) {
    int u = P->use_of[i];
    if (u < 0) {
      if (one_of) continue; /* another chunk's */
      ok = 0;
      break;
    }
    const CudaUse *c = &P->uses[u];
    if (P->ent_tensor) P->ent_tensor[nt] = i;
    t[nt++] = (DevOptTensor){devx_param_ptr(P->x, c->param, c->layer), devx_grad_ptr(P->x, c->param, c->layer), c->numel,
                             ctx->tensors[i].param->weight_decay, NULL, NULL};
  }
  if (P->ent_tensor) P->nent = nt;
  const OptimConfig *oc = &ctx->art->optim;
  char err[1200] = "";
  if (ok && ctx->shards) { /* ZeRO: the entries are the owned slices */
    free(t);
    t = NULL;
    if (zero_setup(P, ctx, &t, err, sizeof err)) ok = 0;
    else P->zero = ctx->shards->zero, nt = P->nent;
  }
  if (ok)
    P->opt = devopt_new(P->dev, oc->kind == OPTIM_ADAMW ? DEVOPT_ADAMW : DEVOPT_SGD, oc->momentum != 0.0, oc->moments16, t, nt, err,
                        sizeof err);
  if (ok && P->opt && P->zero && !(P->sums = realloc(P->sums, sizeof(double) * (size_t)(nt + 1)))) {
    devopt_free(P->opt);
    P->opt = NULL;
    snprintf(err, sizeof err, "out of memory");
  }
  free(t);
  if (!P->opt) P->zero = 0;
  if (err[0] && !P->opt && ctx->comm->world_rank == 0) fprintf(stderr, "hpdlrun: the optimizer stays on the host: %s\n", err);
  P->resident = P->opt != NULL;
  if (!P->resident) { /* the sums go through the loop then: no residual held here */
    devz_free(P->comp);
    P->comp = NULL;
  }
  if (P->resident && !P->zero && overlap_setup(P, ctx)) {
    /* a stream or host memory it could not have: the sums after the step */
    if (!one_of)
      fprintf(stderr, "hpdlrun: no overlap of the data-parallel sum: %s\n", dev_error(P->dev)[0] ? dev_error(P->dev) : "out of memory");
    if (P->cstream) P->dev->ops->stream_destroy(P->dev, P->cstream);
    P->cstream = NULL;
    devx_set_grad_ready(P->x, NULL, NULL);
  }
  if (one_of) return P->resident;
  int moments = moments_of(ctx);
  if (P->resident && P->zero >= 3 && ctx->comm->world_rank == 0)
    fprintf(stderr,
            "hpdlrun: the %s state stays on the device (%.1f MB a rank), ZeRO-3: a rank keeps 1/%d of the parameters, their "
            "moments and reduced gradients; each layer's parameters are all-gathered before it runs%s and released after, "
            "its gradients reduce-scattered as its backward ends (each micro-batch)%s %s%s%s\n",
            state_name(ctx), resident_mb(P, ctx), ctx->comm->size[COMM_DP],
            P->cstream ? " (the next layer's while it runs)" : "", P->rstream ? " on a stream of their own" : "",
            P->dcomm ? "by NCCL on the device" : "through host memory",
            P->nunits > 1 && gathers16(P, 1) ? "; a layer's weights gathered as their bf16 copies" : "", comp_words(P));
  else if (P->resident && P->zero == 2 && ctx->comm->world_rank == 0)
    fprintf(stderr,
            "hpdlrun: parameters and the %s state stay on the device (%.1f MB a rank), ZeRO-2: a rank keeps the moments and "
            "reduced gradients of 1/%d of the parameters; each layer's gradients reduce-scattered as its backward ends (each "
            "micro-batch)%s and the parameters all-gathered after the update %s%s\n",
            state_name(ctx), resident_mb(P, ctx),
            ctx->comm->size[COMM_DP], P->rstream ? " on a stream of their own" : "", P->dcomm ? "by NCCL on the device" : "through host memory",
            comp_words(P));
  else if (P->resident && P->zero && ctx->comm->world_rank == 0)
    fprintf(stderr,
            "hpdlrun: parameters, gradients and the %s state stay on the device (%.1f MB a rank), ZeRO-%d: the moments of "
            "1/%d of the parameters a rank; the gradients reduce-scattered over dp%s and the parameters all-gathered after the "
            "update %s%s\n",
            state_name(ctx), resident_mb(P, ctx), P->zero,
            ctx->comm->size[COMM_DP], P->cstream ? " layer by layer as the backward finishes them" : "",
            P->dcomm ? "by NCCL on the device" : "through host memory", comp_words(P));
  else if (P->resident && ctx->comm->world_rank == 0)
    fprintf(stderr, "hpdlrun: parameters, gradients and the %s state stay on the device (%.1f MB a rank)%s%s\n",
            state_name(ctx), resident_mb(P, ctx), dp_sum_words(P, ctx), comp_words(P));
  double whole = 0, mom = 0;
  for (int k = 0; P->resident && P->zero && k < P->nent; k++)
    if (P->ent_expert[k] == ENT_EXPERT_WHOLE)
      whole += (double)P->uses[P->use_of[P->ent_tensor[k]]].numel * (2 * 4.0 + (double)moments * moment_size(ctx)) / 1e6;
    else if (P->ent_expert[k] == ENT_EXPERT_SLICE) mom += (double)P->ent_n[k] * moments * moment_size(ctx) / 1e6;
  for (int q = 0; P->resident && P->xsliced && q < P->nuses; q++) {
    if (expert_apart(P, &P->uses[q])) whole += (double)P->uses[q].numel * 8.0 / 1e6;
  }
  if (whole > 0 && ctx->comm->world_rank == 0 && !P->xsliced)
    fprintf(stderr, "hpdlrun: ZeRO-%d: the experts' parameters, gradients and moments (%.1f MB a rank) stay whole on the ranks "
                    "holding them, their gradients summed over the %d holding the same experts (edp)\n",
            P->zero, whole, ctx->comm->size[COMM_EDP]);
  else if (whole > 0 && ctx->comm->world_rank == 0)
    fprintf(stderr, "hpdlrun: ZeRO-%d: the experts' parameters and gradients (%.1f MB a rank) stay whole on the ranks holding "
                    "them, their moments (%.1f MB a rank) sharded over the %d holding the same experts (edp), the gradients "
                    "summed over edp and the updated slices all-gathered\n",
            P->zero, whole, mom, ctx->comm->size[COMM_EDP]);
  return P->resident;
}

/* The stage's: one chunk keeps the loop's tensors, its optimizer and its
 * ZeRO; several (virtual stages) each keep the tensors they hold, with an
 * optimizer each and ZeRO over their own units. HPDL_HOST_OPTIMIZER=1
 * keeps the update on the host (for comparison). */
static int cuda_resident(void *self, TrainCtx *ctx) {
  CudaStage *S = self;
  const char *host = getenv("HPDL_HOST_OPTIMIZER");
  if (host && !strcmp(host, "1")) return 0;
  /* compression: bf16 and fp16 on the device (HPDL_COMPRESS_ON=host: the
   * host's, for comparison); int8's scales and top-k's selection the host's */
  CommCompressKind kind = compression_of(ctx);
  const char *on = getenv("HPDL_COMPRESS_ON");
  if (kind != COMM_COMPRESS_NONE && ((on && !strcmp(on, "host")) || !comm_compress_is16(kind))) {
    if (ctx->comm->world_rank == 0)
      fprintf(stderr, "hpdlrun: the optimizer stays on the host: the gradients' %s compression runs there%s\n",
              comm_compress_name(kind), on && !strcmp(on, "host") ? " (HPDL_COMPRESS_ON=host)" : " (bf16 and fp16 run on the device)");
    return 0;
  }
  if (S->n == 1) return chunk_resident(S->c[0], ctx, 0);
  const char *no = NULL;
  if (!(S->chunk_of = calloc((size_t)ctx->ntensors + 1, sizeof(int)))) no = "out of memory";
  for (int i = 0; i < ctx->ntensors && !no; i++) S->chunk_of[i] = -1;
  for (int c = 0; c < S->n && !no; c++) {
    if (!chunk_resident(S->c[c], ctx, 1)) no = "a chunk's optimizer could not be made";
    for (int i = 0; i < ctx->ntensors && !no; i++) {
      if (S->c[c]->use_of[i] < 0) continue;
      if (S->chunk_of[i] >= 0) no = "two chunks hold one tensor";
      S->chunk_of[i] = c;
    }
  }
  for (int i = 0; i < ctx->ntensors && !no; i++)
    if (S->chunk_of[i] < 0) no = "a tensor no chunk of the stage reads";
  if (no) {
    if (ctx->comm->world_rank == 0) fprintf(stderr, "hpdlrun: the optimizer stays on the host: %s\n", no);
    for (int c = 0; c < S->n; c++) {
      S->c[c]->resident = 0;
      devz_free(S->c[c]->comp);
      S->c[c]->comp = NULL;
    }
    return 0;
  }
  int zero = S->c[0]->zero;
  double mb = 0;
  for (int c = 0; c < S->n; c++) mb += resident_mb(S->c[c], ctx);
  char how[200] = "";
  if (zero)
    snprintf(how, sizeof how, ", ZeRO-%d over dp %d (each chunk's units sharded as one chunk's are)", zero, ctx->comm->size[COMM_DP]);
  if (ctx->comm->world_rank == 0)
    fprintf(stderr, "hpdlrun: parameters, gradients and the %s state stay on the device (%.1f MB a rank), an optimizer for each "
                    "of the stage's %d chunks%s%s%s\n",
            state_name(ctx), mb, S->n, how,
            ctx->comm->size[COMM_DP] > 1 && zero ? (S->c[0]->dcomm ? "; by NCCL on the device" : "; through host memory")
                                                  : dp_sum_words(S->c[0], ctx),
            comp_words(S->c[0]));
  return 1;
}

static int cuda_grad_sumsq(void *self, TrainCtx *ctx, const unsigned char *count, double *sumsq, RtErr *e) {
  CudaStage *S = self;
  double s = 0;
  for (int c = 0; c < S->n; c++) {
    CudaProg *P = S->c[c];
    if (devopt_sumsq(P->opt, P->sums)) return fail(e, "%s", devopt_error(P->opt));
    int entries = P->zero || S->n > 1, edp0 = ctx->comm->rank[COMM_EDP] == 0;
    for (int i = 0; i < (entries ? P->nent : ctx->ntensors); i++)
      /* a whole expert tensor (ZeRO) counts on one of the ranks holding it, a slice on its owner */
      if (count[entries ? P->ent_tensor[i] : i] && (!P->zero || P->ent_expert[i] != ENT_EXPERT_WHOLE || edp0)) s += P->sums[i];
  }
  *sumsq = s;
  return 0;
}

static int cuda_update(void *self, TrainCtx *ctx, const OptimConfig *o, int64_t t, double lr, double clip_scale, RtErr *e) {
  CudaStage *S = self;
  for (int c = 0; c < S->n; c++) {
    CudaProg *P = S->c[c];
    int rc = o->kind == OPTIM_ADAMW ? devopt_adamw(P->opt, lr, o->beta1, o->beta2, o->eps, o->weight_decay, t, clip_scale)
                                    : devopt_sgd(P->opt, lr, o->momentum, o->weight_decay, t, clip_scale);
    if (rc) return fail(e, "%s", devopt_error(P->opt));
    if (P->zero && P->zero < 3 && zero_gather(P, ctx, e)) return -1; /* ZeRO 3 gathers as the next step runs */
    if (P->zero && expert_gather(P, ctx, e)) return -1;
  }
  return 0;
}

/* The parameters and the moments between the loop's pools and the device. */
static int cuda_state(void *self, TrainCtx *ctx, int to_host, RtErr *e) {
  CudaStage *S = self;
  for (int i = 0; i < ctx->ntensors && S->c[0]->zero < 3; i++) { /* ZeRO 3: the slices (zero_state) */
    CudaProg *P = S->c[S->n > 1 ? S->chunk_of[i] : 0];
    TrainTensor *x = &ctx->tensors[i];
    const CudaUse *c = &P->uses[P->use_of[i]];
    int rc = to_host ? devx_get_param_copy(P->x, c->param, c->layer, x->data)
                     : devx_set_param_copy(P->x, c->param, c->layer, x->data);
    if (rc) return fail(e, "%s", devx_error(P->x));
    int entry = i;
    if (S->n > 1) /* the chunk's optimizer entry of tensor i */
      for (entry = 0; entry < P->nent && P->ent_tensor[entry] != i; entry++) {
      }
    for (int which = 0; which < 2 && !P->zero; which++) {
      float *h = which ? x->v : x->m;
      if (h && devopt_moment(P->opt, entry, which, h, !to_host)) return fail(e, "%s", devopt_error(P->opt));
    }
  }
  for (int c = 0; c < S->n && S->c[c]->zero; c++)
    if (zero_state(S->c[c], ctx, to_host, e)) return -1;
  return 0;
}

static void cuda_destroy(void *self) {
  CudaStage *S = self;
  if (!S) return;
  CudaProg *P = S->n > 0 ? S->c[0] : NULL;
  if (P && P->timing && P->steps > 0 && P->comm && P->comm->world_rank == 0)
    fprintf(stderr,
            "hpdlrun: device step phases (HPDL_PROFILE, mean of %ld steps): parameters in %.1f ms, inputs %.1f ms, "
            "micro-batches %.1f ms, gradients out %.1f ms\n",
            P->steps, 1e3 * P->t_params / (double)P->steps, 1e3 * P->t_inputs / (double)P->steps, 1e3 * P->t_micro / (double)P->steps,
            1e3 * P->t_grads / (double)P->steps);
  if (P && P->timing && P->x && P->comm && P->comm->world_rank == 0) {
    size_t peak = 0;
    for (int c = 0; c < S->n; c++) {
      size_t now = 0, pk = 0;
      devx_memory(S->c[c]->x, &now, &pk);
      peak += pk;
    }
    double ranges = 0;
    long early = 0, all = 0;
    for (int c = 0; c < S->n; c++) {
      const CudaProg *Q = S->c[c];
      ranges += (double)Q->zown * (4.0 * ((Q->zp != NULL) + (Q->zg != NULL)) +
                                   (double)Q->msize * ((Q->zm != NULL) + (Q->zv != NULL)));
      early += Q->uearly;
      all += Q->uall;
    }
    fprintf(stderr, "hpdlrun: device memory (HPDL_PROFILE, rank 0): the executor's peak %.3f MB (parameters, gradients, "
                    "activations%s), the optimizer's ZeRO ranges %.3f MB\n", (double)peak / 1e6,
            S->n > 1 ? ", the sum of the stage's chunks'" : "", ranges / 1e6);
    if (P->zero)
      fprintf(stderr, "hpdlrun: ZeRO (HPDL_PROFILE, rank 0): %ld of %ld unit reduce-scatters started as the backward finished "
                      "their gradients\n", early, all);
    long zcalls = 0;
    int64_t zvalues = 0;
    for (int c = 0; c < S->n; c++) {
      long n;
      int64_t v;
      devz_counts(S->c[c]->comp, &n, &v);
      zcalls += n;
      zvalues += v;
    }
    if (zcalls)
      fprintf(stderr, "hpdlrun: compression (HPDL_PROFILE, rank 0): %ld sums of gradients rounded to 16 bits on the device, "
                      "%.3f M values\n", zcalls, (double)zvalues / 1e6);
    for (int c = 0; c < S->n && P->launch_top && P->steps > 1; c++) {
      if (S->n > 1) fprintf(stderr, "hpdlrun: chunk %d of the stage:\n", S->c[c]->chunk);
      fprintf(stderr, "hpdlrun: rank 0's launches (HPDL_PROFILE=%d, steps 2..%ld, each launch timed alone):\n", P->launch_top,
              P->steps);
      devx_profile_report(S->c[c]->x, stderr, P->launch_top, (int)(P->steps - 1), 0);
    }
  }
  for (int c = S->n - 1; c >= 0; c--) chunk_destroy(S->c[c]); /* the first last: it owns the device */
  free(S->ins);
  free(S->chunk_of);
  free(S);
}

/* This rank's entry of the manifest: its chunk's module and kernels, or
 * with virtual stages `chunks` (one {chunk, module, kernels} per chunk the
 * stage runs). */
static void *cuda_create(TrainCtx *ctx, RtErr *e) {
  const Artifact *a = ctx->art;
  int me = ctx->comm->world_rank;
  json_error_t je;
  json_t *root = json_load_file(a->manifest_path, 0, &je);
  json_t *r0 = root ? json_array_get(json_object_get(root, "ranks"), (size_t)me) : NULL;
  const char *mod = r0 ? json_string_value(json_object_get(r0, "module")) : NULL;
  const char *ker = r0 ? json_string_value(json_object_get(r0, "kernels")) : NULL;
  json_t *chunks = r0 ? json_object_get(r0, "chunks") : NULL;
  if (!mod || !ker) {
    fail(e, "%s: ranks[%d] names no \"module\" and \"kernels\" (recompile the artifact with --target cuda)", a->manifest_path, me);
    json_decref(root);
    return NULL;
  }
  if (chunks && (!json_is_array(chunks) || json_array_size(chunks) < 1 || json_array_size(chunks) > MAX_STAGE_CHUNKS)) {
    fail(e, "%s: ranks[%d].chunks: a list of 1 to %d chunk files", a->manifest_path, me, MAX_STAGE_CHUNKS);
    json_decref(root);
    return NULL;
  }
  CudaStage *S = calloc(1, sizeof *S);
  if (!S) {
    fail(e, "out of memory");
    json_decref(root);
    return NULL;
  }
  int n = chunks ? (int)json_array_size(chunks) : 1;
  for (int i = 0; i < n; i++) {
    json_t *jc = chunks ? json_array_get(chunks, (size_t)i) : NULL;
    const char *cm = jc ? json_string_value(json_object_get(jc, "module")) : mod;
    const char *ck = jc ? json_string_value(json_object_get(jc, "kernels")) : ker;
    if (!cm || !ck) {
      fail(e, "%s: ranks[%d].chunks[%d] names no \"module\" and \"kernels\" (recompile the artifact with --target cuda)",
           a->manifest_path, me, i);
      break;
    }
    if (!(S->c[i] = chunk_create(ctx, cm, ck, i ? S->c[0] : NULL, e))) break;
    S->n++;
  }
  json_decref(root);
  if (S->n < n) {
    cuda_destroy(S);
    return NULL;
  }
  CudaProg *P = S->c[0];
  S->pp = P->pp;
  S->stage = P->stage;
  S->nchunks = P->nchunks;
  S->v = P->pp > 1 ? P->nchunks / P->pp : 1;
  int bad = 0;
  for (int i = 1; i < S->n; i++) bad |= S->c[i]->nchunks != S->nchunks || S->c[i]->chunk <= S->c[i - 1]->chunk;
  if (bad || (S->pp > 1 && S->n != S->v) || (S->pp <= 1 && S->n != 1)) {
    fail(e, "%s: ranks[%d] holds %d chunk%s of %d over %d pipeline stages (recompile the artifact)", a->manifest_path, me, S->n,
         S->n == 1 ? "" : "s", S->nchunks, S->pp);
    cuda_destroy(S);
    return NULL;
  }
  return S;
}

static const TrainProgram cuda_program_table = {TRAIN_PROGRAM_ABI, "hpdl-cuda", 0, cuda_create, cuda_step, cuda_destroy,
                                                cuda_resident, cuda_grad_sumsq, cuda_update, cuda_state};

const TrainProgram *cuda_program(void) { return &cuda_program_table; }
