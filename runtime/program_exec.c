/* program_exec.c - the CPU program of a compiled artifact: one shared
 * object (DIR/program.so, built once as hpdl-program.so and copied there
 * by `hpdlc compile`) that every rank loads. It exports hpdl_program_v1
 * (train.h) and runs this rank's pipeline chunks through its schedule.
 *
 * create: reads DIR/manifest.json's `ranks[r]` for the rank's chunk file
 * (`module`, program_ir.h; with virtual stages one per chunk, `chunks`)
 * and, when the back end compiled it, the chunk's kernels (`kernels`, a
 * library of compiler/codegen/codegen.h's ABI); maps every parameter copy a chunk
 * reads to this rank's TrainTensor (by name and layer) or, for a copy
 * another chunk holds (the tied embedding on the last stage), to a mirror
 * of its own.
 *
 * step: copies the parameters in, receives the mirrors from their owners,
 * then executes the rank's instruction list (schedule.h, recorded in the
 * chunk file): the forward part of a chunk's step for one micro-batch, the
 * backward part later with that micro-batch's stash, seed grad_scale, so
 * that the gradient store holds exactly what the runtime wants added
 * (see "the step" below); sends the mirrors' gradients to their owners,
 * who add them; adds the gradients to the TrainTensors. The data-parallel
 * reduction is the runtime's.
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

#include "extcall.h"
#include "gemm16.h"
#include "half.h"
#include "hpd_abi.h"
#include "hostop.h"
#include "interp.h"
#include "program_ir.h"
#include "schedule.h"
#include "program.h"
#include "comm_ring.h"
#include "par.h"


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
  int stage, last;   /* this rank's pipeline stage; last: the chunk is the model's last */
  int chunk, pp;     /* the chunk this executor runs; pipeline stages */
  int local;         /* its index among the rank's chunks (0: it may use the runtime's arena) */
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
  CommRing ring; /* context-parallel sends not yet exchanged (comm_ring.h) */
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
  double span_t0;    /* hpdlrun --profile: the start of the kernel running now */
  void **table;
  float **pslot, **gslot; /* per parameter: all copies */
  void **p16;        /* per parameter read in 16 bits: its 16-bit copy (hpd_ctx.param16), else NULL */
  DType *p16type;    /* and that copy's type */
  char *inplace;     /* per parameter: its slots are the runtime's tensors (map_inplace) */
  float *fscratch;
  void *workspace_own;
  ExtCalls *ext;     /* the chunk's extern functions (generated code calls them through hctx) */
  ParPool *pool;  /* the rank's threads for the kernels' rows (Prog's; NULL: one thread) */
  int64_t par_min;   /* hpd_ctx.parallel runs calls of less work than this on one thread */
  int cur_chunk, cur_mb, nmicro; /* what runs now: names the messages */
  CommOutbox outbox; /* pipeline sends not yet completed (comm_ring.h) */
  InterpFrame **frames; /* interp: per micro-batch, its forward's stash */
  /* native: the step's parts (codegen: hpd_graph_<step>_F / _B; NULL when
   * the back end did not cut it: the whole step per micro-batch, one in
   * flight); a workspace per micro-batch in flight, which holds its stash */
  hpd_entry_fn part[2];
  void **slots;
  int nslots;
  /* the step running */
  double total;      /* the loss summed over its micro-batches */
  double seed_d;     /* interp: the seed argument */
  InterpTensor *iouts;
  float seed_f;      /* native: the seed argument */
  HostOpEnv host;    /* native: the ops the generated code hands back (core/hostop.h) */
  float **nouts;     /* per micro-batch, the step's outputs */
  int *slot_of, *busy; /* micro-batch -> workspace slot; slots in use */
  void *ws0;         /* the workspace before the step */
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
  static const char *const n[COMM_NGROUPS] = {"world", "dp", "tp", "pp", "cp", "ep", "edp"};
  return n[g];
}

/* ---- collectives for the reference executor (fp64) ---- */

static const char *ix_all_reduce(void *ctx, IrGroup g, int op, double *data, int64_t n) {
  Exec *x = ctx;
  return c_all_reduce(x->comm, comm_group_of_ir(g), COMM_F64, op ? COMM_MAX : COMM_SUM, data, n, &x->cerr) < 0 ? x->cerr.msg : NULL;
}

static const char *ix_all_gather(void *ctx, IrGroup g, const double *in, int64_t n, double *out) {
  Exec *x = ctx;
  return c_all_gather(x->comm, comm_group_of_ir(g), COMM_F64, in, n, out, &x->cerr) < 0 ? x->cerr.msg : NULL;
}

static const char *ix_all_to_all(void *ctx, IrGroup g, const double *in, int64_t n, double *out) {
  Exec *x = ctx;
  return x->comm->ops->all_to_all(x->comm, comm_group_of_ir(g), COMM_F64, in, n, out, &x->cerr) < 0 ? x->cerr.msg : NULL;
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

/* Chunks form a line: the chunk `offset` places away must exist; it runs
 * on pipeline stage chunk % pp. */
static int pp_peer(Exec *x, int offset, RtErr *e) {
  int c = x->cur_chunk + offset;
  if (c < 0 || c >= x->pc->nchunks) return fail(e, "chunk %d: a transfer to chunk %d, which does not exist", x->cur_chunk, c);
  return c % x->pp;
}

/* The tag of a pipeline transfer by the running (chunk, micro-batch): a
 * send carries this chunk's activation (offset +1) or input gradient (-1);
 * a receive takes the neighbour's. */
static int pipe_tag(Exec *x, int offset, int sending, RtErr *e) {
  int tag = comm_pipe_tag(x->cur_chunk, x->nmicro, x->cur_mb, offset, sending);
  if (tag < 0) return fail(e, "%d micro-batches over %d chunks need more message tags than MPI promises", x->nmicro, x->pc->nchunks);
  return tag;
}

/* A pipeline send does not wait for its receive (comm.h: isend): the data
 * go out of a buffer of their own, in the wire type, freed at the end of
 * the step once every send completed (comm_outbox_flush). */
static int pipe_send(Exec *x, CommType have, const void *data, int64_t n, int peer, int tag, RtErr *e) {
  void *buf = comm_outbox_buffer(&x->outbox, (size_t)n * (size_t)comm_type_size_of(x->wire));
  if (!buf) return fail(e, "out of memory for a pipeline message of %" PRId64 " values", n);
  if (have == x->wire) memcpy(buf, data, (size_t)n * (size_t)comm_type_size_of(have));
  else if (have == COMM_F64)
    for (int64_t i = 0; i < n; i++) ((float *)buf)[i] = (float)((const double *)data)[i];
  else
    for (int64_t i = 0; i < n; i++) ((double *)buf)[i] = ((const float *)data)[i];
  return x->comm->ops->isend(x->comm, COMM_PP, x->wire, buf, n, peer, tag, e);
}

/* Point-to-point for both executors: `have` is the type of data. */
static int p2p_send(Exec *x, int g, CommType have, const void *data, int64_t n, int offset, RtErr *e) {
  if (g == IRG_CP) return comm_ring_send(&x->ring, x->comm, have, data, n, offset, COMM_TAG_RING, e);
  if (g != IRG_PP) return fail(e, "a transfer over the %s group, which has no neighbours", comm_group_name_of(comm_group_of_ir(g)));
  int peer = pp_peer(x, offset, e), tag = peer < 0 ? -1 : pipe_tag(x, offset, 1, e);
  return tag < 0 ? -1 : pipe_send(x, have, data, n, peer, tag, e);
}

static int p2p_recv(Exec *x, int g, CommType have, void *data, int64_t n, int offset, RtErr *e) {
  if (g == IRG_CP) return comm_ring_recv(&x->ring, x->comm, have, data, n, offset, COMM_TAG_RING, e);
  if (g != IRG_PP) return fail(e, "a transfer over the %s group, which has no neighbours", comm_group_name_of(comm_group_of_ir(g)));
  int peer = pp_peer(x, offset, e), tag = peer < 0 ? -1 : pipe_tag(x, offset, 0, e);
  return tag < 0 ? -1 : wire_recv(x, COMM_PP, have, data, n, peer, tag, e);
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
  if (c_all_reduce(x->comm, comm_group_of_ir(group), COMM_F32, op ? COMM_MAX : COMM_SUM, data, n, &x->cerr) < 0) {
    x->hctx.error = x->cerr.msg;
    return -1;
  }
  return 0;
}

static int nx_all_to_all(void *comm, int group, const float *in, int64_t n, float *out) {
  Exec *x = comm;
  if (x->comm->ops->all_to_all(x->comm, comm_group_of_ir(group), COMM_F32, in, n, out, &x->cerr) < 0) {
    x->hctx.error = x->cerr.msg;
    return -1;
  }
  return 0;
}

/* hpd_ctx.kernel_span (hpdlrun --profile): each kernel of the generated
 * code a span on the program track, named by its symbol, with its FLOPs and
 * bytes from the module's kernel table; a GEMM's, an attention's or a
 * convolution's category is "gemm" (compute-bound: the planner prices them
 * together), the others'
 * "kernel" (what plan --compare sorts by). Kernels do not nest: a
 * graph's call is not a kernel, and the callee's kernels time themselves. */
static void nx_kernel_span(hpd_ctx *ctx, int32_t graph, int32_t kernel, int32_t end) {
  Exec *x = ctx->comm;
  const TrainProfiler *pf = x->ctx->prof;
  if (!pf) return;
  double now = pf->now(pf->self);
  if (!end) {
    x->span_t0 = now;
    return;
  }
  const hpd_graph_desc *g = graph >= 0 && graph < x->mod->ngraphs ? &x->mod->graphs[graph] : NULL;
  const hpd_kernel_desc *k = g && kernel >= 0 && kernel < g->nkernels ? &g->kernels[kernel] : NULL;
  if (!k) return;
  int compute = !strcmp(k->kind, "gemm") || !strcmp(k->kind, "attention") || !strcmp(k->kind, "conv");
  pf->span(pf->self, k->name, compute ? "gemm" : "kernel", x->span_t0, now, x->cur_mb, x->chunk, -1,
           (int64_t)k->bytes, k->flops);
}

/* cblas_sgemm of the BLAS the artifact links (row-major; CBLAS's enum
 * values), for the host ops' attention tiles (core/numeric/attn.h). One process
 * links one BLAS, so one pointer serves every program. */
typedef void (*CblasSgemmFn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                             const float *b, int ldb, float beta, float *c, int ldc);
static CblasSgemmFn cblas_sgemm_fn;

static void nx_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
  cblas_sgemm_fn(ROW_MAJOR, trans_a ? TRANS : NO_TRANS, trans_b ? TRANS : NO_TRANS, (int)m, (int)n, (int)k, alpha, a,
                 (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* The hook when the artifact's BLAS has cblas_sgemm; else attn.c's own loops. */
static AttnSgemm nx_sgemm_hook(void *dl) {
  if (!cblas_sgemm_fn && dl) *(void **)&cblas_sgemm_fn = dlsym(dl, "cblas_sgemm");
  return cblas_sgemm_fn ? nx_sgemm : NULL;
}

/* hpd_ctx.gemm_bf16: a GEMM on bf16 operands (core/numeric/gemm16.h),
 * oneDNN's matmul on the rank's threads, else widened to fp32 for the
 * artifact's sgemm. */
static int32_t nx_gemm_bf16(hpd_ctx *ctx, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta, float *c,
                            int64_t ldc) {
  Exec *x = ctx->comm;
  if (gemm16_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cblas_sgemm_fn ? nx_sgemm : NULL,
                  x->ctx->nthreads, x->cerr.msg, (int)sizeof x->cerr.msg)) {
    ctx->error = x->cerr.msg;
    return 1;
  }
  return 0;
}

/* openblas_set_num_threads and openblas_get_num_threads of the artifact's BLAS, NULL
 * for another BLAS. */
typedef void (*BlasSetThreadsFn)(int);
typedef int (*BlasGetThreadsFn)(void);
static BlasSetThreadsFn blas_set_threads_fn;
static BlasGetThreadsFn blas_get_threads_fn;

/* hpd_ctx.gemm_f32: the generated code's fp32 GEMMs. OpenBLAS's threaded
 * sgemm gives other last bits at 1 and 2 threads with its Haswell / Zen
 * kernels (0.3.21 on AMD EPYC: the split moves a block edge into another
 * micro-kernel), so a run's losses would depend on --threads. Instead the
 * product is cut into blocks fixed by its shape alone, each one sgemm on
 * one BLAS thread, run on the pool (or in order without one): the same
 * bits at any thread count. The cut is along the output's longer side, so
 * the operand each block packs again is the smaller one (rows: b's panel;
 * columns: a's); at least GEMM_BLOCK_MIN rows or columns a block (a
 * multiple of 16, the micro-kernels' widths), at most GEMM_BLOCKS blocks,
 * and none below GEMM_SPLIT_MIN multiply-adds (too short to share). */
enum { GEMM_BLOCKS = 8, GEMM_BLOCK_MIN = 256, GEMM_SPLIT_MIN = 1 << 21 };

typedef struct {
  int32_t trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc, block; /* block: rows (by_rows) or columns a block */
  int by_rows;
  float alpha, beta;
  const float *a, *b;
  float *c;
} GemmBlocks;

static void gemm_block(const GemmBlocks *g, int64_t i) {
  int64_t lo = i * g->block, len = (g->by_rows ? g->m : g->n) - lo;
  if (len > g->block) len = g->block;
  if (g->by_rows) /* rows lo.. of op(a) and of c */
    nx_sgemm(g->trans_a, g->trans_b, len, g->n, g->k, g->alpha, g->a + (g->trans_a ? lo : lo * g->lda), g->lda, g->b,
             g->ldb, g->beta, g->c + lo * g->ldc, g->ldc);
  else /* columns lo.. of op(b) and of c */
    nx_sgemm(g->trans_a, g->trans_b, g->m, len, g->k, g->alpha, g->a, g->lda, g->b + (g->trans_b ? lo * g->ldb : lo),
             g->ldb, g->beta, g->c + lo, g->ldc);
}

static int gemm_block_range(void *env, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; i++) gemm_block(env, i);
  return 0;
}

static int32_t nx_gemm_f32(hpd_ctx *ctx, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                           float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                           int64_t ldc) {
  Exec *x = ctx->comm;
  GemmBlocks g = {trans_a, trans_b, m, n, k, lda, ldb, ldc, 0, m >= n, alpha, beta, a, b, c};
  int64_t side = g.by_rows ? m : n, nblocks = 1;
  if (m * n * k >= GEMM_SPLIT_MIN && side >= 2 * GEMM_BLOCK_MIN) {
    nblocks = side / GEMM_BLOCK_MIN < GEMM_BLOCKS ? side / GEMM_BLOCK_MIN : GEMM_BLOCKS;
    g.block = ((side + nblocks - 1) / nblocks + 15) / 16 * 16;
    nblocks = (side + g.block - 1) / g.block;
  }
  if (nblocks == 1) g.block = side;
  int blas_threads = blas_get_threads_fn ? blas_get_threads_fn() : 1;
  if (blas_set_threads_fn && blas_threads != 1) blas_set_threads_fn(1);
  if (x->pool && nblocks > 1)
    par_pool_run(x->pool, nblocks, gemm_block_range, &g);
  else
    gemm_block_range(&g, 0, nblocks);
  if (blas_set_threads_fn && blas_threads != 1) blas_set_threads_fn(blas_threads);
  return 0;
}

typedef struct {
  void (*fn)(void *ctx, int64_t lo, int64_t hi);
  void *ctx;
} AttnRange;

static int attn_range(void *env, int64_t lo, int64_t hi) {
  AttnRange *r = env;
  r->fn(r->ctx, lo, hi);
  return 0;
}

/* The attention host op's work items (core/numeric/attn.h: one per batch
 * and key head, each computed in one fixed order) on the pool. Concurrent
 * calls into a threaded OpenBLAS contend for its one set of threads (4.2x
 * slower at T = 1024, docs/runtime.md), so the BLAS runs one thread per
 * call while the items run: each item's GEMMs on the thread that runs it.
 * Then the BLAS gets back the threads it had, not the rank's count: OpenBLAS
 * takes at most the cores from the environment (runtime/cores.c sets it to
 * the rank's threads), and a product's last bits depend on how many threads
 * split it (3 threads on 2 cores gave other sums than 1 or 2 did). */
static void nx_attn_par_for(void *par, int64_t n, void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx) {
  Exec *x = par;
  AttnRange r = {fn, ctx};
  if (n < 2) {
    fn(ctx, 0, n);
    return;
  }
  int blas_threads = blas_get_threads_fn ? blas_get_threads_fn() : x->ctx->nthreads;
  blas_set_threads_fn(1);
  par_pool_run(x->pool, n, attn_range, &r);
  blas_set_threads_fn(blas_threads);
}

/* hpd_ctx.host_op: node `node` of graph `graph` of the chunk's IR. */
static int nx_host_op(hpd_ctx *ctx, int32_t graph, int32_t node, void **bufs) {
  Exec *x = ctx->comm;
  const IrModule *m = x->pc->m;
  const char *why = NULL;
  int32_t id = node & ~(HOSTOP_PAIR | HOSTOP_ADD);
  if (graph < 0 || graph >= m->ngraphs || node < 0 || id >= m->graphs[graph]->nnodes)
    why = "a host op of a node the stage's IR does not have (the library and stage file disagree)";
  else why = hostop_run(m->graphs[graph], node, bufs, &x->host, x->cerr.msg, sizeof x->cerr.msg);
  if (why && why != x->cerr.msg) snprintf(x->cerr.msg, sizeof x->cerr.msg, "%s", why);
  if (why) ctx->error = x->cerr.msg;
  return why ? -1 : 0;
}

static int nx_all_gather(void *comm, int group, const float *in, int64_t n, float *out) {
  Exec *x = comm;
  if (c_all_gather(x->comm, comm_group_of_ir(group), COMM_F32, in, n, out, &x->cerr) < 0) {
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

/* ---- the kernels' rows on the rank's threads ---- */

/* hpd_ctx.parallel: the generated code's independent rows (a softmax's, a
 * norm's, a cross-entropy's; blocks of an elementwise chain or of a
 * gradient's sum) split over the pool. Below par_min values of work a call
 * stays on this thread: waking the workers costs more than it saves. */
static int32_t nx_parallel(hpd_ctx *ctx, int64_t n, int64_t work, int32_t (*range)(void *env, int64_t lo, int64_t hi),
                           void *env) {
  Exec *x = ctx->comm;
  if (work < x->par_min) return range(env, 0, n);
  return par_pool_run(x->pool, n, range, env);
}

/* The least work (values read and written) worth the pool: a worker
 * asleep through a GEMM takes tens of microseconds to wake on a VM, so a
 * call must run about 0.1 ms on one thread to gain. On GPT-2 124M's step
 * 2^15 made its 0.8 MB bias-gradient sums (25 us each) 2-3x slower; 2^18
 * leaves them and the 1.6 MB transposes on one thread (docs/runtime.md,
 * "Speed on the CPU"). HPDL_PARALLEL_MIN overrides it (0: every
 * splittable loop, as the tests run them). */
enum { PARALLEL_MIN_WORK = 1 << 18 };

static int64_t parallel_min(void) {
  const char *s = getenv("HPDL_PARALLEL_MIN");
  if (!s || !*s) return PARALLEL_MIN_WORK;
  char *end;
  long long v = strtoll(s, &end, 10);
  return *end || v < 0 ? PARALLEL_MIN_WORK : (int64_t)v;
}

/* ---- extern native functions for generated code ---- */

static int nx_call_extern(hpd_ctx *ctx, int32_t index, int32_t grad, void **bufs) {
  Exec *x = ctx->comm;
  int rc = grad ? extcall_grad(ctx->externs, index, bufs, x->cerr.msg, sizeof x->cerr.msg)
                : extcall_forward(ctx->externs, index, bufs, x->cerr.msg, sizeof x->cerr.msg);
  if (rc < 0) {
    ctx->error = x->cerr.msg;
    return -1;
  }
  return 0;
}

/* The extern libraries, loaded once at set-up so that a missing one is an
 * error before the first step: a path with a slash names the artifact's
 * copy (relative to its folder, program_ir.h); a bare name is found on the
 * dlopen search path. The reference executor loads its own handles of the
 * same libraries on their first call (dlopen counts references). */
static int externs_open(Exec *x, RtErr *e) {
  IrModule *m = x->pc->m;
  char why[2048];
  x->ext = extcall_open_artifact(m->externs, m->nexterns, x->ctx->art->dir, x->arena, why, sizeof why);
  return x->ext || !m->nexterns ? 0 : fail(e, "%s", why);
}

/* ---- set-up ---- */

/* One chunk file of a rank, and its kernels ("" when none). */
typedef struct {
  char module[4096], kernels[4096];
  const char *field; /* where the manifest names it, for messages */
} ChunkFiles;

enum { MAX_LOCAL_CHUNKS = 64 };

static int join_path(const Artifact *a, const char *name, char *out, size_t n, RtErr *e) {
  if ((size_t)snprintf(out, n, "%s/%s", a->dir, name) >= n) return fail(e, "%s: path too long", name);
  return 0;
}

/* The rank's entry of the manifest's `ranks` (fields the runtime's reader
 * ignores): module and kernels, or with virtual stages `chunks` (one
 * {chunk, module, kernels} per chunk the stage holds); and
 * program.pipeline_dtype. */
static int read_rank_entry(const Artifact *a, int rank, ChunkFiles *cf, int *ncf, CommType *wire, RtErr *e) {
  json_error_t je;
  json_t *root = json_load_file(a->manifest_path, 0, &je);
  if (!root) return fail(e, "%s: %s", a->manifest_path, je.text);
  json_t *jr = json_array_get(json_object_get(root, "ranks"), (size_t)rank);
  const char *mod = json_string_value(json_object_get(jr, "module"));
  const char *ker = json_string_value(json_object_get(jr, "kernels"));
  const char *wt = json_string_value(json_object_get(json_object_get(root, "program"), "pipeline_dtype"));
  json_t *chunks = json_object_get(jr, "chunks");
  int rc = 0;
  *ncf = 0;
  if (!mod) rc = fail(e, "%s: ranks[%d].module: the rank's chunk file is required (an artifact of hpdlc compile)", a->manifest_path, rank);
  else if (wt && strcmp(wt, "f32") && strcmp(wt, "f64"))
    rc = fail(e, "%s: program.pipeline_dtype: must be \"f32\" or \"f64\"", a->manifest_path);
  else if (chunks && (!json_is_array(chunks) || json_array_size(chunks) < 1 || json_array_size(chunks) > MAX_LOCAL_CHUNKS))
    rc = fail(e, "%s: ranks[%d].chunks: a list of 1 to %d chunk files", a->manifest_path, rank, MAX_LOCAL_CHUNKS);
  else {
    *wire = wt && !strcmp(wt, "f64") ? COMM_F64 : COMM_F32;
    int n = chunks ? (int)json_array_size(chunks) : 1;
    for (int i = 0; i < n && rc == 0; i++) {
      json_t *jc = chunks ? json_array_get(chunks, (size_t)i) : NULL;
      const char *cm = jc ? json_string_value(json_object_get(jc, "module")) : mod;
      const char *ck = jc ? json_string_value(json_object_get(jc, "kernels")) : ker;
      cf[i].field = chunks ? "chunks[].module" : "module";
      cf[i].kernels[0] = 0;
      if (!cm) rc = fail(e, "%s: ranks[%d].chunks[%d].module: the chunk file is required", a->manifest_path, rank, i);
      else if (join_path(a, cm, cf[i].module, sizeof cf[i].module, e) < 0) rc = -1;
      else if (ck && join_path(a, ck, cf[i].kernels, sizeof cf[i].kernels, e) < 0) rc = -1;
    }
    if (rc == 0) *ncf = n;
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
    u->numel = ir_param_numel(u->p);
    if (u->numel > x->scratch_len) x->scratch_len = u->numel;
    if (u->u->owner != x->chunk) continue;
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
    int64_t copies = ir_param_copies(P), n = ir_param_numel(P), found = 0;
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

/* The parameters some node reads in 16 bits (precision.h: a GEMM's weight
 * under bf16) get a 16-bit copy of all their copies, which p16_refresh
 * rounds from the fp32 slot once per step. */
static int p16_open(Exec *x, RtErr *e) {
  const IrModule *m = x->pc->m;
  x->p16 = calloc((size_t)m->nparams + 1, sizeof(void *));
  x->p16type = calloc((size_t)m->nparams + 1, sizeof(DType));
  if (!x->p16 || !x->p16type) return fail(e, "out of memory");
  for (int p = 0; p < m->nparams; p++) {
    const IrParam *P = &m->params[p];
    DType t = ir_param_read_type(m, p);
    if (t == P->dtype) continue;
    if (P->dtype != DT_F32 || (t != DT_BF16 && t != DT_F16))
      return fail(e, "the chunk reads parameter %s as %s, which this program does not make of %s (recompile the artifact)", P->name,
                  sem_dtype_name(t), sem_dtype_name(P->dtype));
    size_t bytes = (size_t)ir_param_numel_all(P) * 2;
    x->p16[p] = aligned_alloc(64, (bytes + 64) / 64 * 64);
    if (!x->p16[p]) return fail(e, "out of memory for the 16-bit copy of %s (%zu bytes)", P->name, bytes);
    x->p16type[p] = t;
  }
  x->hctx.param16 = x->p16;
  /* the loop's optimizer writes the copy of a tensor it updates whole (program.h) */
  TrainCtx *ctx = x->ctx;
  for (int i = 0; ctx->half && i < x->nuses; i++) {
    const Use *u = &x->uses[i];
    if (u->t && x->p16[u->u->param] && x->p16type[u->u->param] == DT_BF16)
      ctx->half[u->t - ctx->tensors] = (uint16_t *)x->p16[u->u->param] + u->u->layer * u->numel;
  }
  return 0;
}

typedef struct {
  const float *src;
  uint16_t *dst;
  int bf16;
} Round16;

static int round16_range(void *env, int64_t lo, int64_t hi) {
  const Round16 *r = env;
  if (r->bf16) {
    /* inline, so that the loop vectorises (a call per value took 3x as long
     * as the per-graph casts it replaces) */
    const uint32_t *src = (const uint32_t *)(const void *)r->src;
    uint16_t *dst = r->dst;
    for (int64_t j = lo; j < hi; j++) dst[j] = half_bf16_bits(src[j]);
  } else
    for (int64_t j = lo; j < hi; j++) r->dst[j] = half_from_f32(r->src[j]);
  return 0;
}

/* Once per step, after the parameters are in (and the mirrors received):
 * the 16-bit copies of the copies the chunk reads, rounded as the generated
 * CAST rounds (to nearest even), but for those the loop's optimizer wrote
 * with the step's update (TrainCtx.half_step). */
static void p16_refresh(Exec *x, ParPool *pool) {
  const TrainCtx *ctx = x->ctx;
  for (int i = 0; x->p16 && i < x->nuses; i++) {
    const Use *u = &x->uses[i];
    int p = u->u->param;
    if (!x->p16[p]) continue;
    uint16_t *dst = (uint16_t *)x->p16[p] + u->u->layer * u->numel;
    if (u->t && ctx->half && ctx->half[u->t - ctx->tensors] == dst && ctx->half_step[u->t - ctx->tensors] == ctx->step) continue;
    Round16 r = {u->fval, dst, x->p16type[p] == DT_BF16};
    par_pool_run(pool, u->numel, round16_range, &r);
  }
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
    size_t n = (size_t)ir_param_numel_all(P);
    x->pslot[p] = calloc(n ? n : 1, sizeof(float));
    x->gslot[p] = calloc(n ? n : 1, sizeof(float));
    if (!x->pslot[p] || !x->gslot[p]) return fail(e, "out of memory for parameter %s", P->name);
  }
  if (map_inplace(x, e) < 0) return -1;
  if (p16_open(x, e) < 0) return -1;
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    x->uses[i].fval = x->pslot[u->u->param] + u->u->layer * u->numel;
    x->uses[i].fgrad = x->gslot[u->u->param] + u->u->layer * u->numel;
  }
  /* The memory planner's arena serves as the workspace of the rank's first
   * chunk when it is large enough (the runtime allocated it, 64-byte
   * aligned); else, and for the other chunks of a stage with virtual
   * stages, one of our own. */
  int64_t need = x->entry->workspace_bytes;
  if (x->local == 0 && need <= x->ctx->arena_bytes) x->hctx.workspace = x->ctx->arena;
  else {
    x->workspace_own = aligned_alloc(64, (size_t)((need + 63) / 64 * 64));
    if (!x->workspace_own) return fail(e, "out of memory for the kernels' workspace (%" PRId64 " bytes)", need);
    x->hctx.workspace = x->workspace_own;
  }
  x->fscratch = calloc((size_t)(x->scratch_len ? x->scratch_len : 1), sizeof(float));
  if (!x->fscratch) return fail(e, "out of memory");
  {
    char sym[256];
    int n = snprintf(sym, sizeof sym, "hpd_graph_");
    for (const char *c = g->name; *c && n < (int)sizeof sym - 3; c++)
      sym[n++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ? *c : '_';
    for (int k = 0; k < 2; k++) {
      sym[n] = '_', sym[n + 1] = k ? 'B' : 'F', sym[n + 2] = 0;
      *(void **)&x->part[k] = dlsym(x->dl, sym);
    }
    if (!x->part[0] || !x->part[1]) x->part[0] = x->part[1] = NULL;
  }
  x->hctx.seed = (uint64_t)x->ctx->art->seed;
  x->hctx.comm = x;
  x->hctx.all_reduce = nx_all_reduce;
  x->hctx.all_gather = nx_all_gather;
  x->hctx.send = nx_send;
  x->hctx.recv = nx_recv;
  x->hctx.externs = x->ext;
  x->hctx.call_extern = nx_call_extern;
  x->hctx.host_op = nx_host_op;
  x->hctx.kernel_span = x->ctx->prof ? nx_kernel_span : NULL;
  x->host.comm = x;
  x->host.all_to_all = nx_all_to_all;
  for (int k = 0; k < IRG_COUNT; k++) {
    x->host.size[k] = x->comm->size[comm_group_of_ir(k)];
    x->host.rank[k] = x->comm->rank[comm_group_of_ir(k)];
  }
  x->host.sgemm = nx_sgemm_hook(x->dl);
  x->host.nthreads = x->ctx->nthreads;
  x->hctx.gemm_bf16 = nx_gemm_bf16;
  for (int k = 0; k < (int)(sizeof x->hctx.rank / sizeof x->hctx.rank[0]); k++) {
    x->hctx.rank[k] = x->comm->rank[comm_group_of_ir(k)];
    x->hctx.size[k] = x->comm->size[comm_group_of_ir(k)];
  }
  return 0;
}

/* hpdlrun --profile: each op the reference executor runs, a span on the
 * program track, named by the op, with its output's bytes (the IR's dtype)
 * and, for a matmul, its FLOPs (2 x the output's values x the inner
 * dimension). */
static double ix_now(void *user) {
  const TrainProfiler *pf = ((Exec *)user)->ctx->prof;
  return pf->now(pf->self);
}

static void ix_op(void *user, int graph, int node, int64_t layer, double t0, double t1) {
  Exec *x = user;
  const TrainProfiler *pf = x->ctx->prof;
  const IrNode *n = &x->pc->m->graphs[graph]->nodes[node];
  double flops = 0;
  if (n->op == IR_MATMUL && n->nin >= 1) {
    const IrNode *a = &x->pc->m->graphs[graph]->nodes[n->in[0]];
    if (a->rank >= 2) flops = 2.0 * (double)ir_numel(n) * (double)a->dims[a->rank - (n->attr[0] ? 2 : 1)];
  }
  pf->span(pf->self, ir_op_name(n->op), "op", t0, t1, x->cur_mb, x->chunk, x->pc->m->graphs[graph]->count > 1 ? layer : -1,
           ir_numel(n) * sem_dtype_bytes(n->dtype), flops);
}

static int interp_open(Exec *x, RtErr *e) {
  const IrModule *m = x->pc->m;
  x->in = interp_new(m);
  if (getenv("HPDL_DETECT_ANOMALY") && *getenv("HPDL_DETECT_ANOMALY") == '1') interp_set_detect_anomaly(x->in, 1);
  /* The initial values are overwritten every step; the seed stays for
   * dropout's masks (interp.c draws them from it). */
  interp_init_params(x->in, (uint64_t)x->ctx->art->seed);
  InterpComm ic;
  memset(&ic, 0, sizeof ic);
  for (int g = 0; g < IRG_COUNT; g++) {
    ic.rank[g] = x->comm->rank[comm_group_of_ir(g)];
    ic.size[g] = x->comm->size[comm_group_of_ir(g)];
  }
  ic.ctx = x;
  ic.all_reduce = ix_all_reduce;
  ic.all_gather = ix_all_gather;
  ic.all_to_all = ix_all_to_all;
  ic.send = ix_send;
  ic.recv = ix_recv;
  interp_set_comm(x->in, &ic);
  if (x->ctx->prof) {
    InterpTimer tm = {x, ix_now, ix_op};
    interp_set_timer(x->in, &tm);
  }
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
  if (x->p16 && x->pc)
    for (int p = 0; p < x->pc->m->nparams; p++) free(x->p16[p]);
  free(x->p16);
  free(x->p16type);
  free(x->table);
  free(x->inplace);
  free(x->fscratch);
  free(x->wbuf);
  comm_ring_clear(&x->ring);
  comm_outbox_free(&x->outbox);
  free(x->workspace_own);
  for (int i = 1; i < x->nslots; i++) free(x->slots[i]); /* slot 0 is the step's own workspace */
  free(x->slots);
  if (x->dl) dlclose(x->dl);
  extcall_close(x->ext);
  free(x->uses);
  if (x->arena) arena_free(x->arena);
  free(x);
}

/* The executor of one chunk the rank holds. */
static Exec *chunk_create(TrainCtx *ctx, const ChunkFiles *cf, int local, CommType wire, RtErr *e) {
  const Artifact *a = ctx->art;
  Exec *x = calloc(1, sizeof *x);
  if (!x) {
    fail(e, "out of memory");
    return NULL;
  }
  x->ctx = ctx;
  x->comm = ctx->comm;
  x->wire = wire;
  x->local = local;
  x->stage = ctx->comm->coords.pp;
  x->pp = (int)a->layout.pp;
  const char *module = cf->module, *kernels = cf->kernels;
  char why[768];
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
    fail(e, "missing artifact file %s (named by %s's ranks[%d].%s)", module, a->manifest_path, ctx->comm->world_rank, cf->field);
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
  x->chunk = pc->chunk;
  x->last = pc->chunk == pc->nchunks - 1;
  if (x->pp < 1 || pc->nchunks % x->pp || pc->chunk % x->pp != x->stage) {
    fail(e, "%s: chunk %d of %d, but this rank is pipeline stage %d of %d (recompile the artifact)", module, pc->chunk, pc->nchunks,
         x->stage, x->pp);
    goto bad;
  }
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *in = &m->inputs[i];
    ProgramFeed f = pc->feed[i];
    int image = f == PROGRAM_FEED_IMAGES, label = f == PROGRAM_FEED_LABELS;
    if ((a->image_rank > 0) != (image || label)) {
      fail(e, "%s: input %s is fed %s, but the manifest's inputs are %s (recompile the artifact)", module, in->name ? in->name : "?",
           image || label ? "images" : "token windows", a->image_rank > 0 ? "images" : "token windows");
      goto bad;
    }
    int ok = in->dims[0] == a->micro_batch;
    if (image) {
      ok = ok && in->rank == a->image_rank + 1 && in->dtype == DT_F32; /* the loader's floats go in as they are */
      for (int k = 0; ok && k < a->image_rank; k++) ok = in->dims[k + 1] == a->image_dims[k];
    } else if (label) {
      ok = ok && in->rank == 1 && in->dtype == DT_I32;
    } else {
      ok = ok && in->rank == 2 && in->dims[1] == a->seq_len;
    }
    if (!ok) {
      if (image || label)
        fail(e, "%s: input %s is not the %s [micro_batch %" PRId64 "%s] the manifest's inputs describe (recompile the artifact)", module,
             in->name ? in->name : "?", image ? "images" : "labels", a->micro_batch, image ? ", inputs.shape" : "");
      else
        fail(e, "%s: input %s is not [micro_batch %" PRId64 ", seq_len %" PRId64 "] as the manifest says", module,
             in->name ? in->name : "?", a->micro_batch, a->seq_len);
      goto bad;
    }
  }
  if (map_uses(x, e) < 0 || externs_open(x, e) < 0) goto bad;
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

/* ---- the step ----
 *
 * A rank holds one chunk per pipeline stage, or several with virtual
 * stages (chunks stage, stage + pp, ...; an executor each, which may differ:
 * generated kernels or the reference). It executes its instruction list
 * (schedule.h) in order: FWD(c, mb) runs the forward part of chunk c's step
 * (IrGraph.fb_split) on micro-batch mb and keeps its stash (interp: a frame;
 * native: a workspace per micro-batch in flight); BWD(c, mb) runs the
 * backward part on that stash. The transfers are the graphs' own SEND /
 * RECV, tagged by (chunk, micro-batch, kind); sends do not wait, so the
 * list's SEND / RECV instructions need no action, and receives wait only for
 * what the list says comes first (schedule.c's simulator checks that the
 * lists never deadlock). HPDL_PIPELINE_ORDER=sequential runs one
 * micro-batch in flight instead (forward and backward back to back), the
 * order before schedules ran: a comparison for benchmarks, with the same
 * numbers. */

typedef struct {
  Exec **x;        /* the chunks this rank holds, ascending */
  int n;
  ParPool *pool; /* the rank's threads, shared by its chunks' kernels */
  SchedInstr *ins; /* this rank's instruction list for ins_m micro-batches */
  int nins, ins_m;
} Prog;

static Exec *held(Prog *P, int chunk) {
  for (int i = 0; i < P->n; i++)
    if (P->x[i]->chunk == chunk) return P->x[i];
  return NULL;
}

static int has_mirror(const Use *u, int d) {
  for (int k = 0; k < u->u->nmirrors; k++)
    if (u->u->mirrors[k] == d) return 1;
  return 0;
}

/* Mirrors: the owner chunk sends each copy (values before the step,
 * gradients back after it) to the chunks that read it too. Every rank walks
 * the same global order - owner chunk, mirror chunk, then the uses in
 * (parameter, layer) order - and each step of it involves two ranks, so
 * sends and receives pair up without a cycle of waits. */
static int tie_params(Prog *P, RtErr *e) {
  int K = P->x[0]->pc->nchunks;
  for (int o = 0; o < K; o++)
    for (int d = o + 1; d < K; d++) {
      Exec *xo = held(P, o), *xd = held(P, d);
      for (int i = 0; xo && i < xo->nuses; i++) {
        Use *u = &xo->uses[i];
        if (u->u->owner != o || !has_mirror(u, d)) continue;
        if (xd) return fail(e, "chunks %d and %d share %s and both run on stage %d (recompile the artifact)", o, d, u->p->name, xo->stage);
        int native = xo->in == NULL;
        void *buf = native ? (void *)u->fval : (void *)u->ival;
        if (wire_send(xo, COMM_PP, native ? COMM_F32 : COMM_F64, buf, u->numel, d % xo->pp, COMM_TAG_TIE_PARAM, e) < 0)
          return prefix(e, "sending %s to stage %d", u->p->name, d % xo->pp);
      }
      for (int i = 0; xd && i < xd->nuses; i++) {
        Use *u = &xd->uses[i];
        if (u->u->owner != o) continue;
        int native = xd->in == NULL;
        void *buf = native ? (void *)u->fval : (void *)u->ival;
        if (wire_recv(xd, COMM_PP, native ? COMM_F32 : COMM_F64, buf, u->numel, o % xd->pp, COMM_TAG_TIE_PARAM, e) < 0)
          return prefix(e, "receiving %s from stage %d", u->p->name, o % xd->pp);
      }
    }
  return 0;
}

static int tie_grads(Prog *P, RtErr *e) {
  int K = P->x[0]->pc->nchunks;
  for (int o = 0; o < K; o++)
    for (int d = o + 1; d < K; d++) {
      Exec *xo = held(P, o), *xd = held(P, d);
      for (int i = 0; xd && i < xd->nuses; i++) {
        Use *u = &xd->uses[i];
        if (u->u->owner != o) continue;
        int native = xd->in == NULL;
        const void *buf;
        if (native) buf = u->fgrad;
        else {
          double *g = interp_grad(xd->in, u->u->param, u->u->layer, NULL);
          if (!g) memset(xd->scratch, 0, sizeof(double) * (size_t)u->numel);
          buf = g ? g : xd->scratch;
        }
        if (wire_send(xd, COMM_PP, native ? COMM_F32 : COMM_F64, buf, u->numel, o % xd->pp, COMM_TAG_TIE_GRAD, e) < 0)
          return prefix(e, "sending the gradient of %s to stage %d", u->p->name, o % xd->pp);
      }
      for (int i = 0; xo && i < xo->nuses; i++) {
        Use *u = &xo->uses[i];
        if (u->u->owner != o || !has_mirror(u, d)) continue;
        int native = xo->in == NULL;
        double *own = native ? NULL : interp_grad(xo->in, u->u->param, u->u->layer, NULL);
        void *in = native ? (void *)xo->fscratch : (void *)xo->scratch;
        if (wire_recv(xo, COMM_PP, native ? COMM_F32 : COMM_F64, in, u->numel, d % xo->pp, COMM_TAG_TIE_GRAD, e) < 0)
          return prefix(e, "receiving the gradient of %s from stage %d", u->p->name, d % xo->pp);
        if (native) {
          for (int64_t j = 0; j < u->numel; j++) u->fgrad[j] += xo->fscratch[j];
        } else if (own) {
          for (int64_t j = 0; j < u->numel; j++) own[j] += xo->scratch[j];
        } else { /* the owner's store holds none (only the mirror differentiates this copy) */
          for (int64_t j = 0; j < u->numel; j++) u->t->grad[j] += (float)xo->scratch[j];
        }
      }
    }
  return 0;
}

/* This rank's instruction list for nmicro micro-batches: what hpdlc compile
 * recorded in the chunk file, rebuilt (sched_build) for another count. */
static int rank_schedule(Prog *P, int nmicro, RtErr *e) {
  const ProgramChunk *pc = P->x[0]->pc;
  const char *order = getenv("HPDL_PIPELINE_ORDER");
  int sequential = order && !strcmp(order, "sequential");
  if (P->ins && P->ins_m == nmicro) return 0;
  free(P->ins);
  P->ins = NULL;
  int pp = P->x[0]->pp, v = pc->sched_v > 0 ? pc->sched_v : 1, r = P->x[0]->stage;
  if (pp * v != pc->nchunks) return fail(e, "the chunk file's schedule has %d chunks per stage, the model %d (recompile the artifact)", v, pc->nchunks / pp);
  int n = 0;
  P->ins = sched_stage_list(pc->schedule, pp, nmicro, v, r, pc->ins, pc->nins, pc->sched_m, sequential, &n);
  if (!P->ins) return fail(e, "out of memory for the pipeline's instruction list");
  P->nins = n;
  P->ins_m = nmicro;
  for (int i = 0; i < n; i++)
    if ((P->ins[i].op == SCHED_OP_FWD || P->ins[i].op == SCHED_OP_BWD) &&
        (!held(P, P->ins[i].chunk) || P->ins[i].mb < 0 || P->ins[i].mb >= nmicro))
      return fail(e, "stage %d: the instruction list runs chunk %d, micro-batch %d, which this rank does not hold (recompile the artifact)",
                  r, P->ins[i].chunk, P->ins[i].mb);
  return 0;
}

/* The tensor of micro-batch b that feeds a model input, and its values. */
static void *feed_of(const DataBatch *b, ProgramFeed f, int64_t *n) {
  switch (f) {
  case PROGRAM_FEED_IMAGES: *n = b->batch * b->image_elems; return b->images;
  case PROGRAM_FEED_LABELS: *n = b->batch; return b->labels;
  case PROGRAM_FEED_TARGETS: *n = b->batch * b->seq_len; return b->targets;
  default: *n = b->batch * b->seq_len; return b->inputs;
  }
}

static void interp_feed(Exec *x, const DataBatch *b) {
  const ProgramChunk *pc = x->pc;
  for (int i = 0; i < pc->m->ninputs; i++) {
    int64_t n;
    const void *src = feed_of(b, pc->feed[i], &n);
    if (pc->feed[i] == PROGRAM_FEED_IMAGES)
      for (int64_t j = 0; j < n; j++) x->inputs[i][j] = (double)((const float *)src)[j];
    else
      for (int64_t j = 0; j < n; j++) x->inputs[i][j] = (double)((const int32_t *)src)[j];
    interp_set_input(x->in, i, x->inputs[i]);
  }
}

/* The workspace of in-flight slot i: slot 0 the one the step used before
 * (the runtime's arena or our own), the others allocated on first use. */
static void *native_slot(Exec *x, int i, RtErr *e) {
  if (i >= x->nslots) {
    void **s = realloc(x->slots, sizeof(void *) * (size_t)(i + 1));
    if (!s) {
      fail(e, "out of memory");
      return NULL;
    }
    x->slots = s;
    for (int k = x->nslots; k <= i; k++) x->slots[k] = NULL;
    if (x->nslots == 0) x->slots[0] = x->hctx.workspace;
    x->nslots = i + 1;
  }
  if (!x->slots[i]) {
    int64_t need = x->entry->workspace_bytes;
    x->slots[i] = aligned_alloc(64, (size_t)((need + 63) / 64 * 64 + 64));
    if (!x->slots[i]) fail(e, "out of memory for the workspace of a micro-batch in flight (%" PRId64 " bytes)", need);
  }
  return x->slots[i];
}

/* Before the micro-batches: the parameters in, the gradients zeroed, the
 * step's buffers. */
static int chunk_begin(Exec *x, int nmicro, RtErr *e) {
  const IrModule *m = x->pc->m;
  const IrGraph *sg = m->graphs[x->pc->step];
  x->nmicro = nmicro;
  x->total = 0;
  if (x->in) {
    for (int i = 0; i < x->nuses; i++) {
      Use *u = &x->uses[i];
      if (u->t)
        for (int64_t j = 0; j < u->numel; j++) u->ival[j] = (double)u->t->data[j];
    }
    interp_zero_grads(x->in);
    interp_set_evaluating(x->in, x->ctx->eval);
    /* seed grad_scale: the store then holds grad_scale x the sum over the
     * micro-batches of d(mean loss)/d(param), what the runtime adds */
    x->seed_d = x->ctx->grad_scale;
    x->iouts = calloc((size_t)sg->noutputs + 1, sizeof(InterpTensor));
    x->frames = calloc((size_t)nmicro, sizeof(InterpFrame *));
    if (!x->iouts || !x->frames) return fail(e, "out of memory");
    return 0;
  }
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    if (u->t && !x->inplace[u->u->param]) memcpy(u->fval, u->t->data, sizeof(float) * (size_t)u->numel);
  }
  for (int p = 0; p < m->nparams; p++)
    if (!x->inplace[p]) memset(x->gslot[p], 0, sizeof(float) * (size_t)ir_param_numel_all(&m->params[p]));
  x->seed_f = (float)x->ctx->grad_scale;
  x->host.loss_seed = x->ctx->grad_scale;
  x->host.evaluating = x->ctx->eval;
  int nout = x->entry->noutputs;
  x->nouts = calloc((size_t)(nout * nmicro) + 1, sizeof(float *));
  x->slot_of = calloc((size_t)nmicro + 1, sizeof(int));
  x->busy = calloc((size_t)nmicro + 1, sizeof(int));
  if (!x->nouts || !x->slot_of || !x->busy) return fail(e, "out of memory");
  for (int j = 0; j < nout * nmicro; j++)
    if (!(x->nouts[j] = calloc((size_t)ir_numel(&sg->nodes[sg->outputs[j % nout]]), sizeof(float)))) return fail(e, "out of memory");
  x->ws0 = x->hctx.workspace;
  if (x->part[0] && !native_slot(x, 0, e)) return -1;
  return 0;
}

static void chunk_end(Exec *x) {
  if (x->frames)
    for (int k = 0; k < x->nmicro; k++) interp_frame_free(x->frames[k]);
  free(x->frames);
  x->frames = NULL;
  if (x->iouts) {
    const IrGraph *sg = x->pc->m->graphs[x->pc->step];
    for (int j = 0; j < sg->noutputs; j++) free(x->iouts[j].data);
  }
  free(x->iouts);
  x->iouts = NULL;
  if (x->nouts && x->entry)
    for (int j = 0; j < x->entry->noutputs * x->nmicro; j++) free(x->nouts[j]);
  free(x->nouts);
  x->nouts = NULL;
  free(x->slot_of);
  free(x->busy);
  x->slot_of = x->busy = NULL;
  if (x->ws0) x->hctx.workspace = x->ws0;
}

/* FWD (fwd = 1) or BWD of micro-batch k. */
static int chunk_run(Exec *x, const DataBatch *b, int k, int fwd, RtErr *e) {
  const ProgramChunk *pc = x->pc;
  const IrModule *m = pc->m;
  const IrGraph *sg = m->graphs[pc->step];
  x->cur_chunk = x->chunk;
  x->cur_mb = k;
  if (x->in) {
    const char *err = NULL;
    InterpTensor s;
    memset(&s, 0, sizeof s);
    s.data = &x->seed_d;
    if (fwd) {
      interp_feed(x, b);
      if (!(x->frames[k] = interp_forward(x->in, pc->step, &s, 1, &err)))
        return fail(e, "chunk %d, forward of micro-batch %d: %s", x->chunk, k, err ? err : "the step failed");
      return 0;
    }
    InterpFrame *f = x->frames[k];
    x->frames[k] = NULL;
    if (!f) return fail(e, "chunk %d: the backward of micro-batch %d before its forward (a bad instruction list)", x->chunk, k);
    if (interp_backward(f, x->iouts, &err) != 0)
      return fail(e, "chunk %d, backward of micro-batch %d: %s", x->chunk, k, err ? err : "the step failed");
    x->total += x->iouts[0].data[0];
    for (int j = 0; j < sg->noutputs; j++) {
      free(x->iouts[j].data);
      x->iouts[j].data = NULL;
    }
    return 0;
  }
  int nout = x->entry->noutputs, cut = x->part[0] != NULL;
  if (!cut && fwd) return 0; /* not cut: the whole step runs at the backward */
  if (cut && fwd) {          /* a free slot: its workspace holds the stash until the backward */
    int s = 0;
    while (s < x->nmicro && x->busy[s]) s++;
    x->busy[s] = 1;
    x->slot_of[k] = s;
  }
  void *ws = cut ? native_slot(x, x->slot_of[k], e) : x->ws0;
  if (!ws) return -1;
  x->hctx.workspace = ws;
  int n = 0;
  x->table[n++] = &x->hctx;
  for (int j = 0; j < m->ninputs; j++) {
    int64_t len;
    x->table[n++] = feed_of(b, pc->feed[j], &len);
  }
  for (int p = 0; p < m->nparams; p++) x->table[n++] = x->pslot[p];
  for (int p = 0; p < m->nparams; p++) x->table[n++] = x->gslot[p];
  x->table[n++] = &x->seed_f;
  /* the step's outputs, the gradients excluded: output 0 is the loss */
  for (int j = 0; j < nout; j++) x->table[n++] = x->nouts[k * nout + j];
  hpd_entry_fn fn = cut ? x->part[fwd ? 0 : 1] : x->entry->fn;
  if (n != x->entry->nbuffers) return fail(e, "the kernels' step takes %d buffers, the program passes %d", x->entry->nbuffers, n);
  x->cerr.msg[0] = 0;
  if (fn(x->table) != 0) {
    /* the kernel names itself; a collective's or transfer's own reason follows */
    char why[2 * sizeof x->cerr.msg];
    const char *said = x->hctx.error ? x->hctx.error : "the step failed";
    if (x->cerr.msg[0] && said != x->cerr.msg) snprintf(why, sizeof why, "%s: %s", said, x->cerr.msg);
    else snprintf(why, sizeof why, "%s", said);
    return fail(e, "chunk %d, %s of micro-batch %d: %s", x->chunk, !cut ? "step" : fwd ? "forward" : "backward", k, why);
  }
  if (!fwd) {
    x->total += x->nouts[k * nout][0];
    if (cut) x->busy[x->slot_of[k]] = 0;
  }
  return 0;
}

/* After the mirrors' gradients arrived: this chunk's gradients into the
 * TrainTensors it owns, and the running statistics the forwards updated
 * (state parameters) back into them where the chunk worked on a copy. */
static void chunk_add_grads(Exec *x) {
  for (int i = 0; i < x->nuses; i++) {
    Use *u = &x->uses[i];
    if (!u->t) continue;
    if (x->pc->m->params[u->u->param].state) {
      if (x->in)
        for (int64_t j = 0; j < u->numel; j++) u->t->data[j] = (float)u->ival[j];
      else if (!x->inplace[u->u->param])
        memcpy(u->t->data, u->fval, sizeof(float) * (size_t)u->numel);
    }
    if (x->in) {
      const double *g = interp_grad(x->in, u->u->param, u->u->layer, NULL);
      if (g)
        for (int64_t j = 0; j < u->numel; j++) u->t->grad[j] += (float)g[j];
    } else if (!x->inplace[u->u->param]) { /* in place: the kernels added them there */
      for (int64_t j = 0; j < u->numel; j++) u->t->grad[j] += u->fgrad[j];
    }
  }
}

static void prog_free(Prog *P) {
  if (!P) return;
  for (int i = 0; i < P->n; i++) {
    chunk_end(P->x[i]);
    exec_free(P->x[i]);
  }
  free(P->x);
  free(P->ins);
  par_pool_destroy(P->pool);
  gemm16_release(); /* before this library is unloaded: its table holds oneDNN's objects */
  free(P);
}

static void *exec_create(TrainCtx *ctx, RtErr *e) {
  ChunkFiles *cf = calloc(MAX_LOCAL_CHUNKS, sizeof *cf);
  Prog *P = calloc(1, sizeof *P);
  int n = 0;
  CommType wire = COMM_F32;
  if (!cf || !P || !(P->x = calloc(MAX_LOCAL_CHUNKS, sizeof(Exec *)))) {
    fail(e, "out of memory");
    goto bad;
  }
  if (read_rank_entry(ctx->art, ctx->comm->world_rank, cf, &n, &wire, e) < 0) goto bad;
  /* no pool, no hook: one thread, the generated code calls its ranges itself */
  P->pool = par_pool_create(ctx->nthreads);
  int64_t par_min = parallel_min();
  for (int i = 0; i < n; i++) {
    if (!(P->x[i] = chunk_create(ctx, &cf[i], i, wire, e))) goto bad;
    P->n = i + 1;
    P->x[i]->pool = P->pool;
    P->x[i]->par_min = par_min;
    P->x[i]->hctx.parallel = P->pool ? nx_parallel : NULL;
    if (P->x[i]->dl && !blas_set_threads_fn) {
      *(void **)&blas_set_threads_fn = dlsym(P->x[i]->dl, "openblas_set_num_threads");
      *(void **)&blas_get_threads_fn = dlsym(P->x[i]->dl, "openblas_get_num_threads");
    }
    /* with threads and no way to hold the BLAS to one (not OpenBLAS: its own
     * threading), the generated code calls cblas_sgemm itself */
    if (P->x[i]->host.sgemm && (blas_set_threads_fn || !P->pool)) P->x[i]->hctx.gemm_f32 = nx_gemm_f32;
    if (P->pool && blas_set_threads_fn && P->x[i]->host.sgemm) {
      P->x[i]->host.par_for = nx_attn_par_for;
      P->x[i]->host.par = P->x[i];
    }
    if (i && P->x[i]->chunk <= P->x[i - 1]->chunk) {
      fail(e, "%s: ranks[%d].chunks: not in ascending chunk order", ctx->art->manifest_path, ctx->comm->world_rank);
      goto bad;
    }
    if (P->x[i]->pc->nchunks != P->x[0]->pc->nchunks || P->x[i]->pc->nchunks != (int)ctx->art->layout.pp * n) {
      fail(e, "%s: the chunk files of ranks[%d] are %d per stage of %d chunks, the layout has pp %" PRId64 " (recompile the artifact)",
           ctx->art->manifest_path, ctx->comm->world_rank, n, P->x[i]->pc->nchunks, (int64_t)ctx->art->layout.pp);
      goto bad;
    }
  }
  free(cf);
  return P;
bad:
  free(cf);
  prog_free(P);
  return NULL;
}

/* hpdlrun --profile: a span of the program track (pf NULL: off) */
static double pnow(const TrainProfiler *pf) { return pf ? pf->now(pf->self) : 0; }

static int exec_step(void *self, TrainCtx *ctx, const DataBatch *const *micro, int nmicro, double *loss, int *has_loss, RtErr *e) {
  Prog *P = self;
  int rc = 0;
  const TrainProfiler *pf = ctx->prof;
  double pt = pnow(pf);
  for (int i = 0; i < P->n && rc == 0; i++) {
    P->x[i]->ctx = ctx;
    rc = chunk_begin(P->x[i], nmicro, e);
  }
  if (rc == 0) rc = tie_params(P, e);
  for (int i = 0; i < P->n && rc == 0; i++) p16_refresh(P->x[i], P->pool);
  if (rc == 0) rc = rank_schedule(P, nmicro, e);
  if (pf) pf->span(pf->self, "parameters in", "program", pt, pnow(pf), -1, -1, -1, 0, 0);
  for (int i = 0; i < P->nins && rc == 0; i++) {
    const SchedInstr *in = &P->ins[i];
    if (in->op != SCHED_OP_FWD && in->op != SCHED_OP_BWD) continue;
    Exec *x = held(P, in->chunk);
    int fwd = in->op == SCHED_OP_FWD;
    pt = pnow(pf);
    rc = chunk_run(x, micro[in->mb], in->mb, fwd, e);
    /* generated code of a step autodiff did not cut: the whole step runs at the backward */
    int whole = !x->in && !x->part[0];
    if (pf && !(whole && fwd))
      pf->span(pf->self, whole ? "forward+backward" : fwd ? "forward" : "backward", whole ? "step" : fwd ? "forward" : "backward", pt,
               pnow(pf), in->mb, in->chunk, -1, 0, 0);
  }
  pt = pnow(pf);
  /* after a failure the job stops: pending sends are left to exec_free */
  for (int i = 0; i < P->n && rc == 0; i++) rc = comm_outbox_flush(&P->x[i]->outbox, P->x[i]->comm, e);
  for (int i = 0; i < P->n; i++) chunk_end(P->x[i]);
  if (rc == 0) rc = tie_grads(P, e);
  *has_loss = 0;
  ctx->aux_loss = 0;
  ctx->has_aux = 0;
  for (int i = 0; i < P->n; i++) {
    Exec *x = P->x[i];
    /* the auxiliary losses the step's forwards ran: the reference executor's, or the host ops' */
    double aux = 0;
    int seen = x->in && interp_take_aux(x->in, &aux);
    if (x->host.aux_seen) aux += x->host.aux_sum, seen = 1, x->host.aux_sum = 0, x->host.aux_seen = 0;
    if (seen) ctx->aux_loss += aux / (double)nmicro, ctx->has_aux = 1;
    if (rc == 0) chunk_add_grads(x);
    if (pf && i == P->n - 1) pf->span(pf->self, "gradients out", "program", pt, pnow(pf), -1, -1, -1, 0, 0);
    if (rc == 0) rc = comm_ring_finish(&x->ring, e);
    else comm_ring_clear(&x->ring);
    if (x->last) {
      *has_loss = 1;
      *loss = x->total / (double)nmicro;
    }
  }
  return rc;
}

static void exec_destroy(void *self) { prog_free(self); }

static const TrainProgram program = {TRAIN_PROGRAM_ABI, "hpdl-chunk", 0, exec_create, exec_step, exec_destroy, NULL, NULL, NULL, NULL};

__attribute__((visibility("default"))) const TrainProgram *hpdl_program_v1(void);
__attribute__((visibility("default"))) const TrainProgram *hpdl_program_v1(void) { return &program; }
