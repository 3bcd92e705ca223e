/* codegen_cpu.c - the CPU back end: the fused module to native code
 * through LLVM's C API, linked into a shared library the runtime dlopens.
 *
 * generate():
 *   1. a memory plan per graph: the static plan of memplan.h when the driver
 *      passes one (CgOptions.memplan: values, in-place loop kernels, stashes
 *      and call workspaces at its offsets), else a first-fit plan over
 *      kernel-order lifetimes (below); graph outputs are computed straight
 *      into the caller's output slots; kernels' scratch (rope's angle table,
 *      a gather's staging) is one region after the entry graph's workspace;
 *   2. one function per kernel (codegen_cpu_kernel.c);
 *   3. per graph the host code: the kernels in fusion order on the planned
 *      buffers, CALLs as loops over the layers (PLAIN / SAVE / BACKWARD,
 *      ir.h) with the stash, the gradient outputs added into the gradient
 *      slots; and its exported entry point hpd_graph_<name>(void **buffers)
 *      (the ABI in codegen.h);
 *   4. the module verified, then optimised with LLVM's new pass manager
 *      ("default<O3>") for the host CPU and its features.
 * emit(): the object file (LLVMTargetMachineEmitToFile), then the system C
 * compiler links it with OpenBLAS into PATH (cc -shared), so the runtime
 * only dlopens a library and no compiler is needed when it runs. */
#include "codegen_cpu.h"
#include "ir_cost.h"
#include "xalloc.h"

#include <errno.h>
#include <inttypes.h>
#include <llvm-c/Analysis.h>
#include <llvm-c/Target.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codegen_cpu_int.h"

extern char **environ;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t align64(int64_t v) { return (v + 63) & ~(int64_t)63; }

static int64_t node_bytes(const IrNode *n) { return ir_numel(n) * sem_dtype_bytes(n->dtype); }

/* ==== the memory plan ==== */

/* Live allocations, kept sorted by offset: first fit into the gaps. */
typedef struct {
  int64_t *off, *size;
  int n, cap;
  int64_t peak;
} Heap;

static int64_t heap_alloc(Heap *h, int64_t size) {
  size = align64(size > 0 ? size : 1);
  int64_t at = 0;
  int pos = 0;
  for (; pos < h->n; pos++) {
    if (h->off[pos] - at >= size) break;
    at = h->off[pos] + h->size[pos];
  }
  if (h->n == h->cap) {
    h->cap = h->cap ? h->cap * 2 : 32;
    h->off = realloc(h->off, sizeof(int64_t) * (size_t)h->cap);
    h->size = realloc(h->size, sizeof(int64_t) * (size_t)h->cap);
    if (!h->off || !h->size) abort();
  }
  memmove(h->off + pos + 1, h->off + pos, sizeof(int64_t) * (size_t)(h->n - pos));
  memmove(h->size + pos + 1, h->size + pos, sizeof(int64_t) * (size_t)(h->n - pos));
  h->off[pos] = at;
  h->size[pos] = size;
  h->n++;
  if (at + size > h->peak) h->peak = at + size;
  return at;
}

static void heap_free(Heap *h, int64_t off) {
  for (int i = 0; i < h->n; i++)
    if (h->off[i] == off) {
      memmove(h->off + i, h->off + i + 1, sizeof(int64_t) * (size_t)(h->n - i - 1));
      memmove(h->size + i, h->size + i + 1, sizeof(int64_t) * (size_t)(h->n - i - 1));
      h->n--;
      return;
    }
}

/* The callee graph's outputs that are not gradients. */
static int plain_outputs(const IrGraph *g) { return g->noutputs - g->ngrad_params; }

/* Per-layer stash of a SAVE call: its arguments, then the callee's outputs
 * 1.., packed (memplan.h's mem_stash_per_layer counts them so). As many
 * slots as the block saves: a layer under context parallelism over a long
 * ring keeps a key / value block per step, more than any fixed bound
 * (64 slots refused GPT-OSS's windowed layers at cp 4 until 2026-12-07). */
typedef struct {
  int nslots;
  int64_t *slot_off, *slot_bytes;
  int64_t layer_bytes;
} StashLayout;

/* Fills L (stash_layout_free releases it). */
static void stash_layout(CgCpu *cg, const IrGraph *g, const IrNode *call, StashLayout *L) {
  const IrGraph *cgph = cg->m->graphs[call->attr[0]];
  memset(L, 0, sizeof *L);
  int nplain = plain_outputs(cgph);
  L->nslots = call->nin + nplain - 1;
  L->slot_off = xalloc_calloc((size_t)(L->nslots > 0 ? L->nslots : 1), sizeof(int64_t));
  L->slot_bytes = xalloc_calloc((size_t)(L->nslots > 0 ? L->nslots : 1), sizeof(int64_t));
  for (int k = 0; k < L->nslots; k++) {
    const IrNode *v = k < call->nin ? &g->nodes[call->in[k]] : &cgph->nodes[cgph->outputs[k - call->nin + 1]];
    L->slot_bytes[k] = node_bytes(v);
    L->slot_off[k] = L->layer_bytes;
    L->layer_bytes += L->slot_bytes[k];
  }
}

static void stash_layout_free(StashLayout *L) {
  free(L->slot_off);
  free(L->slot_bytes);
  memset(L, 0, sizeof *L);
}

/* Own plan: a CALL's temporaries in the caller's workspace, live while it
 * runs: the other ping-pong buffer of output 0, and the outputs 1.. the
 * caller does not keep (PLAIN, BACKWARD). */
static int64_t call_scratch(CgCpu *cg, const IrNode *call) {
  const IrGraph *cgph = cg->m->graphs[call->attr[0]];
  int64_t b = align64(node_bytes(call));
  if (call->attr[2] != IR_CALL_SAVE)
    for (int k = 1; k < plain_outputs(cgph); k++) b += align64(node_bytes(&cgph->nodes[cgph->outputs[k]]));
  return b;
}

/* The base a view aliases (views of views followed). */
static int view_base(const FuseGraph *fg, int v) {
  while (fg->kernels[fg->kernel_of[v]].kind == FUSE_VIEW) v = fg->graph->nodes[v].in[0];
  return v;
}

static int needs_buffer(const FuseGraph *fg, int v) {
  const FuseKernel *K = &fg->kernels[fg->kernel_of[v]];
  IrOp op = fg->graph->nodes[v].op;
  if (K->kind == FUSE_VIEW) return 0;
  if (K->kind == FUSE_LEAF) return op == IR_CONST || op == IR_FILL || op == IR_IOTA;
  for (int i = 0; i < K->noutputs; i++)
    if (K->outputs[i] == v) return 1;
  return 0;
}

/* The memory plan's offsets (memplan.h, fused plan): values, in-place
 * pairs, stashes and call workspaces; the arena is the graph's workspace.
 * Graph outputs are still computed into the caller's slots (their arena
 * space goes unused), and CONSTs the plan made immediates have no buffer. */
static int plan_from_memplan(CgCpu *cg, int gi) {
  const FuseGraph *fg = &cg->fr->graphs[gi];
  const IrGraph *g = fg->graph;
  CgGraph *G = &cg->graphs[gi];
  const MemPlan *mp = cg->opt.memplan;
  if (!mp->fused || mp->m != cg->m || mp->opts.fusion != cg->fr) {
    cg_fail(cg, "the memory plan was not made for this module and fusion");
    return -1;
  }
  const MemGraph *mg = &mp->fused[gi];
  if (!mg->values) {
    cg_fail(cg, "the memory plan has no fused plan of graph %s", g->name);
    return -1;
  }
  for (int v = 0; v < g->nnodes; v++) {
    const MemValue *x = &mg->values[v];
    if (G->out_slot[v] >= 0 || x->buf < 0 || (x->kind != MEM_OWN && x->kind != MEM_INPLACE)) continue;
    if (mg->bufs[x->buf].kind != MEMB_VALUE) continue;
    G->offset[v] = mg->bufs[x->buf].offset;
    if (x->kind == MEM_INPLACE) G->inplace_of[v] = x->of;
  }
  for (int b = 0; b < mg->nbufs; b++) {
    const MemBuf *B = &mg->bufs[b];
    if (B->kind == MEMB_WORKSPACE) G->callws[B->node] = B->offset;
    if (B->kind == MEMB_STASH) G->stash[B->node] = B->offset;
  }
  for (int v = 0; v < g->nnodes; v++) {
    const IrNode *n = &g->nodes[v];
    /* a gradient its kernel adds into the parameter's (memplan.h's grad_into_slots) */
    int into_slot = mp->opts.grad_into_slots && fuse_grad_acc_output(fg, cg->m, fg->kernel_of[v]) == v;
    if (needs_buffer(fg, v) && G->out_slot[v] < 0 && G->offset[v] < 0 && n->op != IR_CONST && !into_slot) {
      cg_fail(cg, "graph %s: the memory plan gives %%%d (%s) no buffer", g->name, v, ir_op_name(n->op));
      return -1;
    }
    if (n->op == IR_CALL && n->attr[2] == IR_CALL_SAVE && G->stash[v] < 0) {
      cg_fail(cg, "graph %s: call %%%d has no stash in the memory plan", g->name, v);
      return -1;
    }
    if (n->op == IR_CALL && G->callws[v] < 0) {
      cg_fail(cg, "graph %s: call %%%d has no workspace in the memory plan", g->name, v);
      return -1;
    }
  }
  G->own_bytes = G->total_bytes = align64(mg->arena);
  return 0;
}

/* Own plan: first fit in kernel order. A value is placed when its kernel
 * runs and freed after its last reader (a view's readers count for its
 * base); a kernel's outputs never share memory with its inputs. A SAVE
 * call's stash lives as long as the call's value (its BACKWARD call reads
 * it); a CALL's temporaries only while it runs. Callees' workspaces go
 * after the graph's own bytes. */
static int plan_first_fit(CgCpu *cg, int gi) {
  const FuseGraph *fg = &cg->fr->graphs[gi];
  const IrGraph *g = fg->graph;
  CgGraph *G = &cg->graphs[gi];
  int n = g->nnodes, nk = fg->nkernels;
  int *last = xalloc_calloc((size_t)n, sizeof(int));
  for (int v = 0; v < n; v++) last[v] = fg->kernel_of[v];
  for (int u = 0; u < n; u++) {
    const IrNode *x = &g->nodes[u];
    for (int i = 0; i < x->nin; i++) {
      int b = view_base(fg, x->in[i]);
      if (fg->kernel_of[u] > last[b]) last[b] = fg->kernel_of[u];
    }
  }
  for (int k = 0; k < g->noutputs; k++) last[view_base(fg, g->outputs[k])] = nk;
  Heap h;
  memset(&h, 0, sizeof h);
  for (int p = 0; p < nk && !cg->failed; p++) {
    const FuseKernel *K = &fg->kernels[p];
    for (int j = 0; j < K->nnodes; j++) {
      int v = K->nodes[j];
      if (needs_buffer(fg, v) && G->out_slot[v] < 0) G->offset[v] = heap_alloc(&h, node_bytes(&g->nodes[v]));
      const IrNode *x = &g->nodes[v];
      if (x->op == IR_CALL && x->attr[2] == IR_CALL_SAVE) {
        StashLayout L;
        stash_layout(cg, g, x, &L);
        G->stash[v] = heap_alloc(&h, L.layer_bytes * x->attr[1]);
        stash_layout_free(&L);
      }
      if (x->op == IR_CALL) {
        G->scratch_bytes[p] = call_scratch(cg, x);
        G->scratch[p] = heap_alloc(&h, G->scratch_bytes[p]);
        heap_free(&h, G->scratch[p]);
      }
    }
    for (int j = 0; j < K->ninputs; j++) {
      int b = view_base(fg, K->inputs[j]);
      if (last[b] == p) {
        if (G->offset[b] >= 0) heap_free(&h, G->offset[b]);
        if (G->stash[b] >= 0) heap_free(&h, G->stash[b]);
      }
    }
    for (int j = 0; j < K->nnodes; j++) { /* values nobody reads */
      int v = K->nodes[j];
      if (last[v] == p && v == view_base(fg, v)) {
        if (G->offset[v] >= 0) heap_free(&h, G->offset[v]);
        if (G->stash[v] >= 0) heap_free(&h, G->stash[v]);
      }
    }
  }
  G->own_bytes = align64(h.peak);
  free(h.off);
  free(h.size);
  free(last);
  return cg->failed ? -1 : 0;
}

static int plan_graph(CgCpu *cg, int gi) {
  const FuseGraph *fg = &cg->fr->graphs[gi];
  const IrGraph *g = fg->graph;
  CgGraph *G = &cg->graphs[gi];
  int n = g->nnodes, nk = fg->nkernels;
  G->offset = xalloc_calloc((size_t)n, sizeof(int64_t));
  G->stash = xalloc_calloc((size_t)n, sizeof(int64_t));
  G->callws = xalloc_calloc((size_t)n, sizeof(int64_t));
  G->inplace_of = xalloc_calloc((size_t)n, sizeof(int));
  G->out_slot = xalloc_calloc((size_t)n, sizeof(int));
  G->scratch = xalloc_calloc((size_t)nk, sizeof(int64_t));
  G->scratch_bytes = xalloc_calloc((size_t)nk, sizeof(int64_t));
  G->nplain = plain_outputs(g);
  for (int i = 0; i < n; i++) {
    G->offset[i] = G->stash[i] = G->callws[i] = -1;
    G->out_slot[i] = G->inplace_of[i] = -1;
  }
  for (int p = 0; p < nk; p++) {
    G->scratch[p] = -1;
    if (fg->kernels[p].kind != FUSE_CALL) {
      int64_t b = cg_kernel_scratch(cg, gi, p);
      if (b > cg->kscratch) cg->kscratch = align64(b);
    }
  }
  /* outputs computed in place: the first occurrence of a value a kernel computes */
  for (int k = 0; k < G->nplain; k++) {
    int v = g->outputs[k];
    if (G->out_slot[v] < 0 && needs_buffer(fg, v)) G->out_slot[v] = k;
  }
  return cg->opt.memplan ? plan_from_memplan(cg, gi) : plan_first_fit(cg, gi);
}

/* ==== host code ==== */

typedef struct {
  CgCpu *cg;
  int gi;
  const FuseGraph *fg;
  const IrGraph *g;
  CgGraph *G;
  LLVMValueRef fn, ctxp, table, ws, layer, args, outs, scratch;
  LLVMValueRef span;             /* hpd_ctx.kernel_span, loaded at entry */
  LLVMValueRef *ptr;             /* per node: i8* */
  LLVMValueRef arg_arr, out_arr; /* i8*[] for CALLs */
  LLVMValueRef par_env;          /* i8*[3]: a gradient sum's range (emit_accumulate) */
  int max_call_args, max_call_outs;
} Host;

static LLVMValueRef load_slot(Host *h, LLVMValueRef arr, int64_t i, const char *name) {
  CgCpu *cg = h->cg;
  return LLVMBuildLoad2(cg->b, cg->tp8, cg_gep(cg, cg->tp8, arr, cg_i64(cg, i), ""), name);
}

static void store_slot(Host *h, LLVMValueRef arr, int64_t i, LLVMValueRef v) {
  CgCpu *cg = h->cg;
  LLVMBuildStore(cg->b, v, cg_gep(cg, cg->tp8, arr, cg_i64(cg, i), ""));
}

/* if (rc != 0) return rc; */
static void check_rc(Host *h, LLVMValueRef rc) { cg_return_if_failed(h->cg, h->fn, rc, rc); }

/* Copy `layer` of parameter p's gradient slot gp (a repeated block's
 * parameter holds one copy a layer of numel floats). */
static LLVMValueRef grad_layer(Host *h, LLVMValueRef gp, const IrParam *P, int64_t numel) {
  if (P->count <= 1) return gp;
  return cg_byte_ptr(h->cg, gp, LLVMBuildMul(h->cg->b, h->layer, cg_i64(h->cg, numel * 4), ""), "grad.l");
}

/* The buffer node v is computed into (a null pointer for a CONST the
 * memory plan made an immediate: only kernels that inline it read it). */
static LLVMValueRef value_ptr(Host *h, int v) {
  CgCpu *cg = h->cg;
  if (h->G->out_slot[v] >= 0) return load_slot(h, h->outs, h->G->out_slot[v], "out");
  if (h->G->offset[v] >= 0) return cg_byte_ptr(cg, h->ws, cg_i64(cg, h->G->offset[v]), "buf");
  if (h->g->nodes[v].op != IR_CONST) cg_fail(cg, "graph %s: %%%d has no buffer", h->g->name, v);
  return LLVMConstNull(cg->tp8);
}

/* Parameter p as leaf node n reads it: the fp32 tensor in the table, or
 * (n 16-bit) the runtime's 16-bit copy, ctx->param16[p]; copy h->layer of
 * a repeated block's. */
static LLVMValueRef param_ptr(Host *h, int p, const IrNode *n) {
  CgCpu *cg = h->cg;
  const IrParam *P = &cg->m->params[p];
  int half = n->dtype != P->dtype;
  LLVMValueRef base;
  if (half) {
    LLVMValueRef tab = cg_ctx_field(cg, h->ctxp, CG_CTX_PARAM16, "param16");
    LLVMValueRef q = LLVMBuildInBoundsGEP2(cg->b, cg->tp8, tab, (LLVMValueRef[]){cg_i64(cg, p)}, 1, "");
    base = LLVMBuildLoad2(cg->b, cg->tp8, q, "param16.p");
  } else {
    base = load_slot(h, h->table, cg->m->ninputs + p, "param");
  }
  if (P->count <= 1) return base;
  int64_t numel = 1;
  for (int i = 0; i < P->rank; i++) numel *= P->dims[i];
  LLVMValueRef off = LLVMBuildMul(cg->b, h->layer, cg_i64(cg, numel * sem_dtype_bytes(n->dtype)), "");
  return cg_byte_ptr(cg, base, off, "param.l");
}

/* Whether kernel p of the graph runs code of its own that a profile times
 * (not a view, a call, a leaf without a kernel, or a collective: the
 * runtime's collectives time themselves). */
static int timed_kernel(const FuseGraph *fg, const CgGraph *G, int p) {
  const FuseKernel *K = &fg->kernels[p];
  if (K->kind == FUSE_VIEW || K->kind == FUSE_CALL || K->kind == FUSE_COMM) return 0;
  if (K->kind == FUSE_LEAF) {
    const IrNode *n = &fg->graph->nodes[K->nodes[0]];
    return n->op != IR_INPUT && n->op != IR_PARAM && n->op != IR_ARG && G->kfn && G->kfn[p];
  }
  return 1;
}

/* if (ctx->kernel_span) ctx->kernel_span(ctx, graph, p, end); */
static void span_hook(Host *h, int p, int end) {
  CgCpu *cg = h->cg;
  LLVMBasicBlockRef call = LLVMAppendBasicBlockInContext(cg->ctx, h->fn, "span");
  LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(cg->ctx, h->fn, "span.next");
  LLVMBuildCondBr(cg->b, LLVMBuildIsNull(cg->b, h->span, ""), next, call);
  LLVMPositionBuilderAtEnd(cg->b, call);
  LLVMValueRef a[4] = {h->ctxp, cg_i32(cg, h->gi), cg_i32(cg, p), cg_i32(cg, end)};
  LLVMBuildCall2(cg->b, cg->tspan, h->span, a, 4, "");
  LLVMBuildBr(cg->b, next);
  LLVMPositionBuilderAtEnd(cg->b, next);
}

static void emit_leaf(Host *h, int p) {
  CgCpu *cg = h->cg;
  int v = h->fg->kernels[p].nodes[0];
  const IrNode *n = &h->g->nodes[v];
  switch (n->op) {
  case IR_INPUT: h->ptr[v] = load_slot(h, h->table, n->attr[0], "input"); break;
  case IR_PARAM: h->ptr[v] = param_ptr(h, (int)n->attr[0], n); break;
  case IR_ARG: h->ptr[v] = load_slot(h, h->args, n->attr[0], "arg"); break;
  default: {
    h->ptr[v] = value_ptr(h, v);
    if (LLVMIsNull(h->ptr[v])) break; /* an immediate */
    LLVMValueRef a[4] = {h->ctxp, h->scratch, h->layer, h->ptr[v]};
    check_rc(h, cg_call(cg, h->G->kfn[p], a, 4, "rc"));
    break;
  }
  }
}

static void emit_kernel(Host *h, int p) {
  CgCpu *cg = h->cg;
  const FuseKernel *K = &h->fg->kernels[p];
  int nio = K->ninputs + K->noutputs;
  LLVMValueRef *a = xalloc_calloc((size_t)nio + 3, sizeof(LLVMValueRef));
  /* a gradient added into the parameter's slot may have no buffer (memplan.h's
   * grad_into_slots); it is output accj (the fused head's pair has dx too) */
  int accv = h->G->kacc && h->G->kacc[p] ? fuse_grad_acc_output(h->fg, cg->m, p) : -1, accj = 0;
  for (int j = 0; j < K->noutputs; j++)
    if (K->outputs[j] == accv) accj = j;
  int unbuffered = accv >= 0 && h->G->out_slot[accv] < 0 && h->G->offset[accv] < 0;
  int pair = fuse_linear_ce_pair(h->fg, p);
  for (int j = 0; j < K->noutputs; j++)
    h->ptr[K->outputs[j]] = unbuffered && j == accj ? LLVMConstNull(cg->tp8) : value_ptr(h, K->outputs[j]);
  a[0] = h->ctxp;
  a[1] = h->scratch;
  a[2] = h->layer;
  for (int j = 0; j < nio; j++) {
    int v = j < K->ninputs ? K->inputs[j] : K->outputs[j - K->ninputs];
    if (!h->ptr[v]) {
      cg_fail(cg, "graph %s kernel k%d: %%%d has no buffer yet", h->g->name, p, v);
      h->ptr[v] = LLVMConstNull(cg->tp8);
    }
    a[3 + j] = h->ptr[v];
  }
  if (!h->G->kacc || !h->G->kacc[p]) {
    check_rc(h, cg_call(cg, h->G->kfn[p], a, nio + 3, "rc"));
    free(a);
    return;
  }
  /* a gradient GEMM or lookup backward (fuse_grad_acc_output): with the
   * parameter's gradient slot (copy `layer`) it adds its result there (beta =
   * 1), so nothing is added after the graph; without one (a parameter this
   * run does not train) it writes its buffer, which nothing reads */
  int v = accv, grad = -1;
  for (int k = h->G->nplain; k < h->g->noutputs; k++)
    if (h->g->outputs[k] == v) grad = h->g->grad_params[k - h->G->nplain];
  const IrParam *P = &cg->m->params[grad];
  LLVMValueRef gp = load_slot(h, h->table, cg->m->ninputs + cg->m->nparams + grad, "grad");
  LLVMBasicBlockRef add = LLVMAppendBasicBlockInContext(cg->ctx, h->fn, "grad.into");
  LLVMBasicBlockRef own = LLVMAppendBasicBlockInContext(cg->ctx, h->fn, "grad.own");
  LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(cg->ctx, h->fn, "grad.next2");
  LLVMBuildCondBr(cg->b, LLVMBuildIsNull(cg->b, gp, ""), own, add);
  LLVMPositionBuilderAtEnd(cg->b, add);
  int64_t numel = ir_numel(&h->g->nodes[v]);
  a[3 + K->ninputs + accj] = grad_layer(h, gp, P, numel);
  check_rc(h, cg_call(cg, h->G->kacc[p], a, nio + 3, "rc"));
  LLVMBuildBr(cg->b, next);
  LLVMPositionBuilderAtEnd(cg->b, own);
  /* else nobody wants the gradient: the kernel does not run (the pair still
   * makes dx, without dw) */
  if (!unbuffered || pair) {
    a[3 + K->ninputs + accj] = h->ptr[v];
    check_rc(h, cg_call(cg, h->G->kfn[p], a, nio + 3, "rc"));
  }
  LLVMBuildBr(cg->b, next);
  LLVMPositionBuilderAtEnd(cg->b, next);
  free(a);
}

static LLVMValueRef call_graph(Host *h, int v, int callee, LLVMValueRef layer) {
  CgCpu *cg = h->cg;
  int64_t at = h->G->callws[v] >= 0 ? h->G->callws[v] : h->G->own_bytes;
  LLVMValueRef ws = cg_byte_ptr(cg, h->ws, cg_i64(cg, at), "ws.callee");
  LLVMValueRef args_arr = LLVMBuildBitCast(cg->b, h->arg_arr, cg->tpp8, "");
  LLVMValueRef outs_arr = LLVMBuildBitCast(cg->b, h->out_arr, cg->tpp8, "");
  LLVMValueRef a[7] = {h->ctxp, h->table, ws, layer, args_arr, outs_arr, h->scratch};
  return cg_call(cg, cg->graphs[callee].fn, a, 7, "rc");
}

/* Under the memory plan, where the callee's output k lives in its own
 * workspace (memplan.h: a call's outputs are copied out of it). */
static LLVMValueRef callee_output(Host *h, int v, int callee, int k) {
  CgCpu *cg = h->cg;
  const MemGraph *mg = &cg->opt.memplan->fused[callee];
  const IrGraph *cgph = cg->m->graphs[callee];
  const MemValue *x = &mg->values[cgph->outputs[k]];
  if (x->buf < 0) {
    cg_fail(cg, "graph %s: output %d of %s has no buffer in the memory plan", h->g->name, k, cgph->name);
    return LLVMConstNull(cg->tp8);
  }
  return cg_byte_ptr(cg, h->ws, cg_i64(cg, h->G->callws[v] + mg->bufs[x->buf].offset), "callee.out");
}

/* A CALL node: its graph run `count` times (ir.h's three modes). Output 0
 * of a layer is argument 0 of the next: under the memory plan it is copied
 * from the callee's workspace into the call's buffer; under the back end's
 * own plan two buffers take turns (the last layer writes the call's). */
static void emit_call_into(Host *h, int p, LLVMValueRef *discard);

static void emit_call(Host *h, int p) {
  const IrNode *n = &h->g->nodes[h->fg->kernels[p].nodes[0]];
  int nplain = plain_outputs(h->cg->m->graphs[n->attr[0]]);
  /* where outputs 1.. of a layer go when the caller keeps none of them */
  LLVMValueRef *discard = xalloc_calloc((size_t)(nplain > 0 ? nplain : 1), sizeof *discard);
  emit_call_into(h, p, discard);
  free(discard);
}

static void emit_call_into(Host *h, int p, LLVMValueRef *discard) {
  CgCpu *cg = h->cg;
  int v = h->fg->kernels[p].nodes[0];
  const IrNode *n = &h->g->nodes[v];
  int callee = (int)n->attr[0];
  int64_t count = n->attr[1], mode = n->attr[2], first = n->attr[3];
  const IrGraph *cgph = cg->m->graphs[callee];
  int nplain = plain_outputs(cgph), planned = cg->opt.memplan != NULL;
  LLVMValueRef args_arr = LLVMBuildBitCast(cg->b, h->arg_arr, cg->tpp8, "args");
  LLVMValueRef outs_arr = LLVMBuildBitCast(cg->b, h->out_arr, cg->tpp8, "outs");
  h->ptr[v] = value_ptr(h, v);
  if (count < 1) {
    cg_fail(cg, "graph %s: call %%%d runs %" PRId64 " times", h->g->name, v, count);
    return;
  }
  int64_t out0 = node_bytes(n);
  LLVMValueRef scratch = NULL;
  if (planned) {
    for (int k = 1; k < nplain && mode != IR_CALL_SAVE; k++) discard[k] = callee_output(h, v, callee, k);
  } else {
    scratch = cg_byte_ptr(cg, h->ws, cg_i64(cg, h->G->scratch[p]), "call.tmp");
    int64_t at = align64(out0);
    for (int k = 1; k < nplain && mode != IR_CALL_SAVE; k++) {
      discard[k] = cg_byte_ptr(cg, scratch, cg_i64(cg, at), "discard");
      at += align64(node_bytes(&cgph->nodes[cgph->outputs[k]]));
    }
  }
  CgLoop l;
  if (mode == IR_CALL_PLAIN || mode == IR_CALL_BACKWARD) {
    int bwd = mode == IR_CALL_BACKWARD;
    StashLayout L;
    LLVMValueRef stash = NULL;
    if (bwd) {
      if (n->nin != 2 || h->g->nodes[n->in[1]].op != IR_CALL || h->G->stash[n->in[1]] < 0) {
        cg_fail(cg, "graph %s: backward call %%%d has no SAVE call to read", h->g->name, v);
        return;
      }
      const IrNode *save = &h->g->nodes[n->in[1]];
      stash_layout(cg, h->g, save, &L);
      if (cgph->nargs != 1 + L.nslots || save->attr[1] != count) {
        cg_fail(cg, "graph %s: backward call %%%d does not match its SAVE call", h->g->name, v);
        stash_layout_free(&L);
        return;
      }
      stash = cg_byte_ptr(cg, h->ws, cg_i64(cg, h->G->stash[n->in[1]]), "stash");
    } else if (n->nin != cgph->nargs) {
      cg_fail(cg, "graph %s: call %%%d passes %d arguments to %s, which takes %d", h->g->name, v, n->nin, cgph->name,
              cgph->nargs);
      return;
    }
    LLVMValueRef cur0 = h->ptr[n->in[0]];
    cg_loop_open(cg, &l, cg_i64(cg, count), 1, &cur0, "layer");
    /* PLAIN runs layers 0..count-1, BACKWARD count-1..0 */
    LLVMValueRef layer = bwd ? LLVMBuildSub(cg->b, cg_i64(cg, count - 1), l.iv, "l") : l.iv;
    store_slot(h, args_arr, 0, l.phi[0]);
    if (bwd) {
      LLVMValueRef lb =
          cg_byte_ptr(cg, stash, LLVMBuildMul(cg->b, layer, cg_i64(cg, L.layer_bytes), ""), "layer.stash");
      for (int k = 0; k < L.nslots; k++)
        store_slot(h, args_arr, 1 + k, cg_byte_ptr(cg, lb, cg_i64(cg, L.slot_off[k]), ""));
    } else {
      for (int k = 1; k < n->nin; k++) store_slot(h, args_arr, k, h->ptr[n->in[k]]);
    }
    LLVMValueRef dest;
    if (planned) {
      dest = callee_output(h, v, callee, 0);
    } else {
      /* the last iteration (j = count - 1) writes the call's buffer */
      LLVMValueRef left = LLVMBuildSub(cg->b, cg_i64(cg, count - 1), l.iv, "");
      LLVMValueRef even =
          LLVMBuildICmp(cg->b, LLVMIntEQ, LLVMBuildAnd(cg->b, left, cg_i64(cg, 1), ""), cg_i64(cg, 0), "");
      dest = LLVMBuildSelect(cg->b, even, h->ptr[v], scratch, "dest");
    }
    store_slot(h, outs_arr, 0, dest);
    for (int k = 1; k < nplain; k++) store_slot(h, outs_arr, k, discard[k]);
    check_rc(h, call_graph(h, v, callee, LLVMBuildAdd(cg->b, layer, cg_i64(cg, first), "")));
    if (planned) {
      cg_memmove(cg, h->ptr[v], dest, cg_i64(cg, out0));
      dest = h->ptr[v];
    }
    cg_loop_close(cg, &l, &dest, 0, NULL);
    if (bwd) stash_layout_free(&L);
    return;
  }
  if (mode == IR_CALL_SAVE) {
    /* per layer, its arguments and outputs 1.. into the stash; output 0
     * straight into the next layer's argument slot (the last: the call's buffer) */
    StashLayout L;
    stash_layout(cg, h->g, n, &L);
    LLVMValueRef stash = cg_byte_ptr(cg, h->ws, cg_i64(cg, h->G->stash[v]), "stash");
    cg_memcpy(cg, cg_byte_ptr(cg, stash, cg_i64(cg, L.slot_off[0]), ""), h->ptr[n->in[0]], cg_i64(cg, L.slot_bytes[0]));
    cg_loop_open(cg, &l, cg_i64(cg, count), 0, NULL, "layer");
    LLVMValueRef lb = cg_byte_ptr(cg, stash, LLVMBuildMul(cg->b, l.iv, cg_i64(cg, L.layer_bytes), ""), "layer.stash");
    for (int k = 0; k < n->nin; k++) {
      LLVMValueRef slot = cg_byte_ptr(cg, lb, cg_i64(cg, L.slot_off[k]), "");
      if (k) cg_memcpy(cg, slot, h->ptr[n->in[k]], cg_i64(cg, L.slot_bytes[k]));
      store_slot(h, args_arr, k, slot);
    }
    LLVMValueRef next0 = cg_byte_ptr(cg, lb, cg_i64(cg, L.layer_bytes + L.slot_off[0]), "");
    LLVMValueRef last = LLVMBuildICmp(cg->b, LLVMIntEQ, l.iv, cg_i64(cg, count - 1), "");
    store_slot(h, outs_arr, 0, LLVMBuildSelect(cg->b, last, h->ptr[v], next0, "dest"));
    for (int k = 1; k < nplain; k++)
      store_slot(h, outs_arr, k, cg_byte_ptr(cg, lb, cg_i64(cg, L.slot_off[n->nin + k - 1]), ""));
    check_rc(h, call_graph(h, v, callee, LLVMBuildAdd(cg->b, l.iv, cg_i64(cg, first), "")));
    cg_loop_close(cg, &l, NULL, 0, NULL);
    stash_layout_free(&L);
    return;
  }
  cg_fail(cg, "graph %s: call %%%d has an unknown mode %" PRId64, h->g->name, v, mode);
}

/* dst[i] += src[i] over n floats (gradient accumulation). */
/* dst[i] += src[i] for the i of blocks [lo, hi) of ACC_BLOCK values:
 * hpd.acc.range(i8 **env, lo, hi) over env = {dst, src, (i8 *)n}, a range
 * of hpd_ctx.parallel. Each value is one addition wherever it runs. */
enum { ACC_BLOCK = 4096, ACC_PARALLEL_MIN = 2 * ACC_BLOCK };

static LLVMValueRef acc_range_fn(CgCpu *cg) {
  if (cg->fn_acc_range) return cg->fn_acc_range;
  LLVMBasicBlockRef here = LLVMGetInsertBlock(cg->b);
  LLVMTypeRef rp[3] = {cg->tp8, cg->ti64, cg->ti64};
  LLVMValueRef fn = cg_add_function(cg, "hpd.acc.range", cg->ti32, rp, 3, 1);
  LLVMPositionBuilderAtEnd(cg->b, LLVMAppendBasicBlockInContext(cg->ctx, fn, "entry"));
  LLVMValueRef env = LLVMBuildBitCast(cg->b, LLVMGetParam(fn, 0), cg->tpp8, "env");
  LLVMValueRef f[3];
  for (int i = 0; i < 3; i++) f[i] = LLVMBuildLoad2(cg->b, cg->tp8, cg_gep(cg, cg->tp8, env, cg_i64(cg, i), ""), "");
  LLVMValueRef d = LLVMBuildBitCast(cg->b, f[0], cg->tpf32, "dst"), s = LLVMBuildBitCast(cg->b, f[1], cg->tpf32, "src");
  LLVMValueRef n = LLVMBuildPtrToInt(cg->b, f[2], cg->ti64, "n");
  LLVMValueRef start = LLVMBuildMul(cg->b, LLVMGetParam(fn, 1), cg_i64(cg, ACC_BLOCK), "start");
  LLVMValueRef end = LLVMBuildMul(cg->b, LLVMGetParam(fn, 2), cg_i64(cg, ACC_BLOCK), "");
  end = LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSGT, end, n, ""), n, end, "end");
  CgLoop l;
  cg_loop_open(cg, &l, LLVMBuildSub(cg->b, end, start, ""), 0, NULL, "acc");
  LLVMValueRef i = LLVMBuildAdd(cg->b, start, l.iv, "");
  LLVMValueRef pd = cg_gep(cg, cg->tf32, d, i, ""), ps = cg_gep(cg, cg->tf32, s, i, "");
  LLVMValueRef v =
      LLVMBuildFAdd(cg->b, LLVMBuildLoad2(cg->b, cg->tf32, pd, ""), LLVMBuildLoad2(cg->b, cg->tf32, ps, ""), "");
  LLVMBuildStore(cg->b, v, pd);
  cg_loop_close(cg, &l, NULL, 0, NULL);
  LLVMBuildRet(cg->b, cg_i32(cg, 0));
  LLVMPositionBuilderAtEnd(cg->b, here);
  return cg->fn_acc_range = fn;
}

/* dst[0 .. n) += src[0 .. n): a gradient output added into its slot; a
 * large one (the tied embedding's, a block's weights) on the rank's threads. */
static void emit_accumulate(Host *h, LLVMValueRef dst8, LLVMValueRef src8, int64_t n) {
  CgCpu *cg = h->cg;
  if (n >= ACC_PARALLEL_MIN) {
    LLVMValueRef env = LLVMBuildBitCast(cg->b, h->par_env, cg->tpp8, "");
    LLVMValueRef f[3] = {dst8, src8, LLVMBuildIntToPtr(cg->b, cg_i64(cg, n), cg->tp8, "")};
    for (int i = 0; i < 3; i++) LLVMBuildStore(cg->b, f[i], cg_gep(cg, cg->tp8, env, cg_i64(cg, i), ""));
    /* the range never fails: the status is always 0 */
    cg_parallel(cg, h->ctxp, acc_range_fn(cg), LLVMBuildBitCast(cg->b, env, cg->tp8, ""),
                cg_i64(cg, (n + ACC_BLOCK - 1) / ACC_BLOCK), cg_i64(cg, 3 * n));
    return;
  }
  LLVMValueRef d = LLVMBuildBitCast(cg->b, dst8, cg->tpf32, ""), s = LLVMBuildBitCast(cg->b, src8, cg->tpf32, "");
  CgLoop l;
  cg_loop_open(cg, &l, cg_i64(cg, n), 0, NULL, "acc");
  LLVMValueRef pd = cg_gep(cg, cg->tf32, d, l.iv, ""), ps = cg_gep(cg, cg->tf32, s, l.iv, "");
  LLVMValueRef v =
      LLVMBuildFAdd(cg->b, LLVMBuildLoad2(cg->b, cg->tf32, pd, ""), LLVMBuildLoad2(cg->b, cg->tf32, ps, ""), "");
  LLVMBuildStore(cg->b, v, pd);
  cg_loop_close(cg, &l, NULL, 0, NULL);
}

/* The pointers of a forward kernel's values, without running it: the
 * backward part finds in the workspace what the forward part left there. */
static void point_kernel(Host *h, int p) {
  const FuseKernel *K = &h->fg->kernels[p];
  int v = K->nodes[0];
  const IrNode *n = &h->g->nodes[v];
  switch (K->kind) {
  case FUSE_LEAF:
    if (n->op == IR_INPUT || n->op == IR_PARAM || n->op == IR_ARG) emit_leaf(h, p);
    else h->ptr[v] = value_ptr(h, v);
    break;
  case FUSE_VIEW:
    for (int j = 0; j < K->nnodes; j++) h->ptr[K->nodes[j]] = h->ptr[h->g->nodes[K->nodes[j]].in[0]];
    break;
  case FUSE_CALL: h->ptr[v] = value_ptr(h, v); break;
  default:
    for (int j = 0; j < K->noutputs; j++) h->ptr[K->outputs[j]] = value_ptr(h, K->outputs[j]);
    break;
  }
}

/* The host code of graph gi into fn: part -1 the whole graph; 0 the
 * forward part of a cut step (its kernels only); 1 the backward part (the
 * forward kernels' pointers, its kernels, the outputs and gradients). */
static void build_host(CgCpu *cg, int gi, LLVMValueRef fn, int part) {
  const FuseGraph *fg = &cg->fr->graphs[gi];
  const IrGraph *g = fg->graph;
  CgGraph *G = &cg->graphs[gi];
  Host h;
  memset(&h, 0, sizeof h);
  h.cg = cg;
  h.gi = gi;
  h.fg = fg;
  h.g = g;
  h.G = G;
  h.fn = fn;
  h.ctxp = LLVMGetParam(h.fn, 0);
  h.table = LLVMGetParam(h.fn, 1);
  h.ws = LLVMGetParam(h.fn, 2);
  h.layer = LLVMGetParam(h.fn, 3);
  h.args = LLVMGetParam(h.fn, 4);
  h.outs = LLVMGetParam(h.fn, 5);
  h.scratch = LLVMGetParam(h.fn, 6);
  h.ptr = xalloc_calloc((size_t)g->nnodes, sizeof(LLVMValueRef));
  LLVMPositionBuilderAtEnd(cg->b, LLVMAppendBasicBlockInContext(cg->ctx, h.fn, "entry"));
  h.span = cg_ctx_field(cg, h.ctxp, CG_CTX_KERNEL_SPAN, "span");
  int maxa = 1, maxo = 1;
  for (int p = 0; p < fg->nkernels; p++)
    if (fg->kernels[p].kind == FUSE_CALL) {
      const IrGraph *c = cg->m->graphs[g->nodes[fg->kernels[p].nodes[0]].attr[0]];
      if (c->nargs > maxa) maxa = c->nargs;
      if (c->noutputs > maxo) maxo = c->noutputs;
    }
  h.arg_arr = LLVMBuildAlloca(cg->b, LLVMArrayType(cg->tp8, (unsigned)maxa), "call.args");
  h.out_arr = LLVMBuildAlloca(cg->b, LLVMArrayType(cg->tp8, (unsigned)maxo), "call.outs");
  h.par_env = LLVMBuildAlloca(cg->b, LLVMArrayType(cg->tp8, 3), "acc.env");
  for (int p = 0; p < fg->nkernels && !cg->failed; p++) {
    const FuseKernel *K = &fg->kernels[p];
    if (part >= 0 && fuse_kernel_part(fg, p) != part) {
      if (part == 1) point_kernel(&h, p);
      continue;
    }
    int timed = timed_kernel(fg, G, p);
    if (timed) span_hook(&h, p, 0);
    switch (K->kind) {
    case FUSE_LEAF: emit_leaf(&h, p); break;
    case FUSE_VIEW:
      for (int j = 0; j < K->nnodes; j++) h.ptr[K->nodes[j]] = h.ptr[g->nodes[K->nodes[j]].in[0]];
      break;
    case FUSE_CALL: emit_call(&h, p); break;
    default: emit_kernel(&h, p); break;
    }
    if (timed) span_hook(&h, p, 1);
  }
  if (part == 0) { /* the outputs and gradients come with the backward part */
    LLVMBuildRet(cg->b, cg_i32(cg, 0));
    free(h.ptr);
    return;
  }
  /* outputs not computed in their slots (leaves, views, repeats) */
  for (int k = 0; k < G->nplain && !cg->failed; k++) {
    int v = g->outputs[k];
    if (G->out_slot[v] == k) continue;
    cg_memmove(cg, load_slot(&h, h.outs, k, "out"), h.ptr[v], cg_i64(cg, node_bytes(&g->nodes[v])));
  }
  /* gradient outputs: added into copy `layer` of the parameter's gradient */
  for (int k = G->nplain; k < g->noutputs && !cg->failed; k++) {
    int v = g->outputs[k], p = g->grad_params[k - G->nplain];
    const IrParam *P = &cg->m->params[p];
    if (G->acc_out && G->acc_out[v]) continue; /* its kernel added it (emit_kernel) */
    if (P->dtype != DT_F32 || g->nodes[v].dtype != DT_F32) {
      cg_fail(cg, "graph %s: gradients of f32 parameters only", g->name);
      break;
    }
    LLVMValueRef gp = load_slot(&h, h.table, cg->m->ninputs + cg->m->nparams + p, "grad");
    LLVMBasicBlockRef add = LLVMAppendBasicBlockInContext(cg->ctx, h.fn, "grad.add");
    LLVMBasicBlockRef skip = LLVMAppendBasicBlockInContext(cg->ctx, h.fn, "grad.next");
    LLVMBuildCondBr(cg->b, LLVMBuildIsNull(cg->b, gp, ""), skip, add);
    LLVMPositionBuilderAtEnd(cg->b, add);
    int64_t numel = ir_numel(&g->nodes[v]);
    emit_accumulate(&h, grad_layer(&h, gp, P, numel), h.ptr[v], numel);
    LLVMBuildBr(cg->b, skip);
    LLVMPositionBuilderAtEnd(cg->b, skip);
  }
  LLVMBuildRet(cg->b, cg_i32(cg, 0));
  free(h.ptr);
}

static void build_graph(CgCpu *cg, int gi) {
  CgGraph *G = &cg->graphs[gi];
  build_host(cg, gi, G->fn, -1);
  if (!fuse_can_cut(&cg->fr->graphs[gi])) return;
  LLVMTypeRef gp[7] = {cg->tpctx, cg->tpp8, cg->tp8, cg->ti64, cg->tpp8, cg->tpp8, cg->tp8};
  for (int part = 0; part < 2 && !cg->failed; part++) {
    char name[200];
    snprintf(name, sizeof name, "graph.%s.%s", cg->m->graphs[gi]->name, part ? "backward" : "forward");
    G->part_fn[part] = cg_add_function(cg, name, cg->ti32, gp, 7, 1);
    build_host(cg, gi, G->part_fn[part], part);
  }
}

/* hpd_graph_<name>(void **buffers): unpacks the table (codegen.h); the
 * parts of a cut step: hpd_graph_<name>_F and _B, the same table. */
static LLVMValueRef build_entry_of(CgCpu *cg, int gi, LLVMValueRef fn, const char *sym);

static void build_entry(CgCpu *cg, int gi) {
  CgGraph *G = &cg->graphs[gi];
  G->entry = build_entry_of(cg, gi, G->fn, G->sym);
  for (int part = 0; part < 2; part++)
    if (G->part_fn[part]) {
      char sym[200];
      snprintf(sym, sizeof sym, "%s_%s", G->sym, part ? "B" : "F");
      G->part_entry[part] = build_entry_of(cg, gi, G->part_fn[part], sym);
    }
}

static LLVMValueRef build_entry_of(CgCpu *cg, int gi, LLVMValueRef fn, const char *sym) {
  const IrGraph *g = cg->m->graphs[gi];
  CgGraph *G = &cg->graphs[gi];
  LLVMTypeRef pt = cg->tpp8;
  LLVMValueRef entry = cg_add_function(cg, sym, cg->ti32, &pt, 1, 0);
  LLVMPositionBuilderAtEnd(cg->b, LLVMAppendBasicBlockInContext(cg->ctx, entry, "entry"));
  LLVMValueRef buf = LLVMGetParam(entry, 0);
  LLVMValueRef ctx8 = LLVMBuildLoad2(cg->b, cg->tp8, buf, "ctx8");
  LLVMValueRef ctxp = LLVMBuildBitCast(cg->b, ctx8, cg->tpctx, "ctx");
  int64_t nin = cg->m->ninputs, np = cg->m->nparams;
  LLVMValueRef a[7];
  a[0] = ctxp;
  a[1] = cg_gep(cg, cg->tp8, buf, cg_i64(cg, HPD_BUF_INPUTS), "table");
  a[2] = cg_ctx_field(cg, ctxp, CG_CTX_WORKSPACE, "ws");
  a[3] = cg_ctx_field(cg, ctxp, CG_CTX_LAYER, "layer");
  a[4] = cg_gep(cg, cg->tp8, buf, cg_i64(cg, HPD_BUF_INPUTS + nin + 2 * np), "args");
  a[5] = cg_gep(cg, cg->tp8, buf, cg_i64(cg, HPD_BUF_INPUTS + nin + 2 * np + g->nargs), "outs");
  a[6] = cg_byte_ptr(cg, a[2], cg_i64(cg, G->total_bytes), "scratch"); /* the kernels' scratch after the workspace */
  LLVMBuildRet(cg->b, cg_call(cg, fn, a, 7, "rc"));
  return entry;
}

/* hpd_kernel_<graph>_<k>(void **io): io[0] the ctx, then the kernel's
 * inputs and outputs; scratch is ctx->workspace (tests). */
static void build_kernel_entry(CgCpu *cg, int gi, int p) {
  CgGraph *G = &cg->graphs[gi];
  const FuseKernel *K = &cg->fr->graphs[gi].kernels[p];
  char name[200];
  snprintf(name, sizeof name, "hpd_kernel_%s_%d", G->sym + strlen("hpd_graph_"), p);
  LLVMTypeRef pt = cg->tpp8;
  LLVMValueRef fn = cg_add_function(cg, name, cg->ti32, &pt, 1, 0);
  LLVMPositionBuilderAtEnd(cg->b, LLVMAppendBasicBlockInContext(cg->ctx, fn, "entry"));
  LLVMValueRef io = LLVMGetParam(fn, 0);
  int nio = K->ninputs + K->noutputs;
  LLVMValueRef *a = xalloc_calloc((size_t)nio + 3, sizeof(LLVMValueRef));
  LLVMValueRef ctxp = LLVMBuildBitCast(cg->b, LLVMBuildLoad2(cg->b, cg->tp8, io, ""), cg->tpctx, "ctx");
  a[0] = ctxp;
  a[1] = cg_ctx_field(cg, ctxp, CG_CTX_WORKSPACE, "ws");
  a[2] = cg_ctx_field(cg, ctxp, CG_CTX_LAYER, "layer");
  for (int j = 0; j < nio; j++)
    a[3 + j] = LLVMBuildLoad2(cg->b, cg->tp8, cg_gep(cg, cg->tp8, io, cg_i64(cg, 1 + j), ""), "");
  LLVMBuildRet(cg->b, cg_call(cg, G->kfn[p], a, nio + 3, "rc"));
  free(a);
}

static LLVMValueRef const_string(CgCpu *cg, const char *s, const char *name) {
  LLVMValueRef init = LLVMConstStringInContext(cg->ctx, s, (unsigned)strlen(s), 0);
  LLVMValueRef gv = LLVMAddGlobal(cg->mod, LLVMTypeOf(init), name);
  LLVMSetInitializer(gv, init);
  LLVMSetGlobalConstant(gv, 1);
  LLVMSetLinkage(gv, LLVMPrivateLinkage);
  LLVMSetUnnamedAddress(gv, LLVMGlobalUnnamedAddr);
  return LLVMConstBitCast(gv, cg->tp8);
}

/* The exported descriptor: hpd_module (codegen.h's hpd_module_desc). */
static void build_descriptor(CgCpu *cg) {
  const IrModule *m = cg->m;
  /* hpd_kernel_desc: name, kind, flops, bytes */
  LLVMTypeRef kfields[4] = {cg->tp8, cg->tp8, cg->tf64, cg->tf64};
  LLVMTypeRef kt = LLVMStructCreateNamed(cg->ctx, "hpd_kernel_desc");
  LLVMStructSetBody(kt, kfields, 4, 0);
  LLVMTypeRef dfields[9] = {cg->tp8, LLVMPointerType(cg->tkern_entry, 0), cg->ti32, cg->ti32, cg->ti32, cg->ti32,
                            cg->ti64, cg->ti32, LLVMPointerType(kt, 0)};
  LLVMTypeRef dt = LLVMStructCreateNamed(cg->ctx, "hpd_graph_desc");
  LLVMStructSetBody(dt, dfields, 9, 0);
  LLVMValueRef *descs = xalloc_calloc((size_t)m->ngraphs, sizeof(LLVMValueRef));
  for (int gi = 0; gi < m->ngraphs; gi++) {
    const IrGraph *g = m->graphs[gi];
    const FuseGraph *fg = &cg->fr->graphs[gi];
    CgGraph *G = &cg->graphs[gi];
    /* the kernel table (profiles): every kernel, timed or not, by index */
    int nk = fg->nkernels;
    LLVMValueRef *ks = xalloc_calloc((size_t)nk + 1, sizeof(LLVMValueRef));
    for (int p = 0; p < nk; p++) {
      const FuseKernel *K = &fg->kernels[p];
      double flops = 0, bytes = 0;
      for (int j = 0; j < K->nnodes; j++) flops += ircost_node(m, g, K->nodes[j]).flops;
      for (int j = 0; j < K->ninputs; j++) bytes += (double)node_bytes(&g->nodes[K->inputs[j]]);
      for (int j = 0; j < K->noutputs; j++) bytes += (double)node_bytes(&g->nodes[K->outputs[j]]);
      size_t len = 0;
      const char *kn = G->kfn && G->kfn[p] ? LLVMGetValueName2(G->kfn[p], &len) : NULL;
      char name[200];
      if (kn && len) snprintf(name, sizeof name, "%.*s", (int)len, kn);
      else snprintf(name, sizeof name, "%s.k%d.%s", g->name, p, cg_kernel_family(g, K));
      const char *kind = cg_kernel_family(g, K);
      LLVMValueRef kf[4] = {const_string(cg, name, "kernel.name"), const_string(cg, kind, "kernel.kind"),
                            LLVMConstReal(cg->tf64, flops), LLVMConstReal(cg->tf64, bytes)};
      ks[p] = LLVMConstNamedStruct(kt, kf, 4);
    }
    LLVMValueRef karr = LLVMConstArray(kt, ks, (unsigned)nk);
    LLVMValueRef gk = LLVMAddGlobal(cg->mod, LLVMTypeOf(karr), "hpd_kernels");
    LLVMSetInitializer(gk, karr);
    LLVMSetGlobalConstant(gk, 1);
    LLVMSetLinkage(gk, LLVMPrivateLinkage);
    free(ks);
    LLVMValueRef kz[2] = {cg_i32(cg, 0), cg_i32(cg, 0)};
    LLVMValueRef f[9] = {const_string(cg, g->name, "graph.name"),
                         G->entry,
                         cg_i32(cg, g->nargs),
                         cg_i32(cg, G->nplain),
                         cg_i32(cg, g->ngrad_params),
                         cg_i32(cg, HPD_BUF_INPUTS + m->ninputs + 2 * m->nparams + g->nargs + G->nplain),
                         cg_i64(cg, G->total_bytes + cg->kscratch),
                         cg_i32(cg, nk),
                         LLVMConstInBoundsGEP2(LLVMTypeOf(karr), gk, kz, 2)};
    descs[gi] = LLVMConstNamedStruct(dt, f, 9);
  }
  LLVMValueRef arr = LLVMConstArray(dt, descs, (unsigned)m->ngraphs);
  LLVMValueRef garr = LLVMAddGlobal(cg->mod, LLVMTypeOf(arr), "hpd_graphs");
  LLVMSetInitializer(garr, arr);
  LLVMSetGlobalConstant(garr, 1);
  LLVMSetLinkage(garr, LLVMPrivateLinkage);
  free(descs);
  char target[256];
  snprintf(target, sizeof target, "%s %s", cg->triple, cg->cpu);
  LLVMTypeRef mfields[6] = {cg->ti32, cg->ti32, cg->ti32, cg->ti32, LLVMPointerType(dt, 0), cg->tp8};
  LLVMTypeRef mt = LLVMStructCreateNamed(cg->ctx, "hpd_module_desc");
  LLVMStructSetBody(mt, mfields, 6, 0);
  LLVMValueRef zero[2] = {cg_i32(cg, 0), cg_i32(cg, 0)};
  LLVMValueRef mf[6] = {cg_i32(cg, HPD_ABI_VERSION),
                        cg_i32(cg, m->ngraphs),
                        cg_i32(cg, m->ninputs),
                        cg_i32(cg, m->nparams),
                        LLVMConstInBoundsGEP2(LLVMTypeOf(arr), garr, zero, 2),
                        const_string(cg, target, "target")};
  LLVMValueRef md = LLVMAddGlobal(cg->mod, mt, HPD_MODULE_SYMBOL);
  LLVMSetInitializer(md, LLVMConstNamedStruct(mt, mf, 6));
  LLVMSetGlobalConstant(md, 1);
}

/* ==== the target ==== */

static void init_types(CgCpu *cg) {
  LLVMContextRef c = cg->ctx;
  cg->tvoid = LLVMVoidTypeInContext(c);
  cg->ti1 = LLVMInt1TypeInContext(c);
  cg->ti8 = LLVMInt8TypeInContext(c);
  cg->ti16 = LLVMInt16TypeInContext(c);
  cg->ti32 = LLVMInt32TypeInContext(c);
  cg->ti64 = LLVMInt64TypeInContext(c);
  cg->tf32 = LLVMFloatTypeInContext(c);
  cg->tf64 = LLVMDoubleTypeInContext(c);
  cg->tp8 = LLVMPointerType(cg->ti8, 0);
  cg->tpp8 = LLVMPointerType(cg->tp8, 0);
  cg->tpf32 = LLVMPointerType(cg->tf32, 0);
  cg->tpf64 = LLVMPointerType(cg->tf64, 0);
  cg->tpi32 = LLVMPointerType(cg->ti32, 0);
  cg->tpi64 = LLVMPointerType(cg->ti64, 0);
  /* the collectives of hpd_ctx */
  LLVMTypeRef ar[5] = {cg->tp8, cg->ti32, cg->ti32, cg->tpf32, cg->ti64};
  LLVMTypeRef ag[5] = {cg->tp8, cg->ti32, cg->tpf32, cg->ti64, cg->tpf32};
  cg->tcoll[0] = LLVMFunctionType(cg->ti32, ar, 5, 0);
  cg->tcoll[1] = LLVMFunctionType(cg->ti32, ag, 5, 0);
  cg->tcoll[2] = LLVMFunctionType(cg->ti32, ar, 5, 0);
  cg->tcoll[3] = LLVMFunctionType(cg->ti32, ar, 5, 0);
  for (int i = 0; i < 4; i++) cg->tpcoll[i] = LLVMPointerType(cg->tcoll[i], 0);
  /* the struct is named first: the extern hook's type points back at it */
  cg->tctx = LLVMStructCreateNamed(c, "hpd_ctx");
  cg->tpctx = LLVMPointerType(cg->tctx, 0);
  LLVMTypeRef f[CG_CTX_NFIELDS] = {cg->tp8,
                                   cg->ti64,
                                   cg->ti64,
                                   LLVMArrayType(cg->ti32, 4),
                                   LLVMArrayType(cg->ti32, 4),
                                   cg->tp8,
                                   cg->tpcoll[0],
                                   cg->tpcoll[1],
                                   cg->tpcoll[2],
                                   cg->tpcoll[3],
                                   cg->tp8,
                                   cg->tp8,
                                   LLVMPointerType(cg_extern_hook_type(cg), 0),
                                   LLVMPointerType(cg_extern_hook_type(cg), 0), /* host_op: the same signature */
                                   NULL};
  LLVMTypeRef sp[4] = {cg->tpctx, cg->ti32, cg->ti32, cg->ti32};
  cg->tspan = LLVMFunctionType(LLVMVoidTypeInContext(c), sp, 4, 0);
  f[CG_CTX_KERNEL_SPAN] = LLVMPointerType(cg->tspan, 0);
  LLVMTypeRef rp[3] = {cg->tp8, cg->ti64, cg->ti64};
  cg->trange = LLVMFunctionType(cg->ti32, rp, 3, 0);
  LLVMTypeRef pp[5] = {cg->tpctx, cg->ti64, cg->ti64, LLVMPointerType(cg->trange, 0), cg->tp8};
  cg->tparallel = LLVMFunctionType(cg->ti32, pp, 5, 0);
  f[CG_CTX_PARALLEL] = LLVMPointerType(cg->tparallel, 0);
  LLVMTypeRef gp[14] = {cg->tpctx, cg->ti32, cg->ti32, cg->ti64, cg->ti64, cg->ti64, cg->tf32,
                        cg->tp8,   cg->ti64, cg->tp8,  cg->ti64, cg->tf32, cg->tpf32, cg->ti64};
  cg->tgemm16 = LLVMFunctionType(cg->ti32, gp, 14, 0);
  f[CG_CTX_GEMM_BF16] = LLVMPointerType(cg->tgemm16, 0);
  f[CG_CTX_PARAM16] = cg->tpp8;
  f[CG_CTX_GEMM_F32] = LLVMPointerType(cg->tgemm16, 0); /* the same signature, a and b as i8 * */
  LLVMStructSetBody(cg->tctx, f, CG_CTX_NFIELDS, 0);
  cg->tkern_entry = LLVMFunctionType(cg->ti32, &cg->tpp8, 1, 0);
  cg->md_loop = LLVMGetMDKindIDInContext(c, "llvm.loop", 9);
}

static void cpu_destroy(CgTarget *t);

/* The target machine for the host (or CgOptions' cpu and features). */
static int cpu_setup(CgCpu *cg) {
  CG_CHECK(cg, -1, "LLVMInitializeNativeTarget", !LLVMInitializeNativeTarget());
  CG_CHECK(cg, -1, "LLVMInitializeNativeAsmPrinter", !LLVMInitializeNativeAsmPrinter());
  cg->ctx = LLVMContextCreate();
  cg->mod = LLVMModuleCreateWithNameInContext("hpdl", cg->ctx);
  cg->b = LLVMCreateBuilderInContext(cg->ctx);
  init_types(cg);
  cg->triple = LLVMGetDefaultTargetTriple();
  cg->cpu = cg->opt.cpu ? strdup(cg->opt.cpu) : LLVMGetHostCPUName();
  cg->features = cg->opt.features ? strdup(cg->opt.features) : LLVMGetHostCPUFeatures();
  LLVMTargetRef target = NULL;
  CG_CHECK_MSG(cg, -1, "LLVMGetTargetFromTriple", LLVMGetTargetFromTriple(cg->triple, &target, &cg_msg_));
  cg->tm = LLVMCreateTargetMachine(target, cg->triple, cg->cpu, cg->features, LLVMCodeGenLevelAggressive, LLVMRelocPIC,
                                   LLVMCodeModelDefault);
  CG_CHECK(cg, -1, "LLVMCreateTargetMachine", cg->tm != NULL);
  LLVMSetTarget(cg->mod, cg->triple);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(cg->tm);
  LLVMSetModuleDataLayout(cg->mod, td);
  LLVMDisposeTargetData(td);
  return 0;
}

static CgTarget *cpu_create(const IrModule *m, const FuseResult *fr, const CgOptions *opt, char *err, size_t errlen) {
  CgCpu *cg = xalloc_calloc(1, sizeof *cg);
  cg->m = m;
  cg->fr = fr;
  if (opt) cg->opt = *opt;
  cg->graphs = xalloc_calloc((size_t)(m->ngraphs > 0 ? m->ngraphs : 1), sizeof(CgGraph));
  if (cpu_setup(cg)) {
    snprintf(err, errlen, "%s", cg->err);
    cpu_destroy((CgTarget *)cg);
    return NULL;
  }
  return (CgTarget *)cg;
}

static int cpu_generate(CgTarget *t) {
  CgCpu *cg = (CgCpu *)t;
  const IrModule *m = cg->m;
  if (cg->generated) return cg->failed ? -1 : 0;
  cg->generated = 1;
  double t0 = now();
  /* plans, callees first: a graph's workspace holds its deepest call's after its own */
  for (int gi = m->ngraphs - 1; gi >= 0 && !cg->failed; gi--) {
    if (plan_graph(cg, gi)) break;
    CgGraph *G = &cg->graphs[gi];
    int64_t deepest = 0;
    const FuseGraph *fg = &cg->fr->graphs[gi];
    for (int p = 0; p < fg->nkernels; p++)
      if (fg->kernels[p].kind == FUSE_CALL) {
        int c = (int)fg->graph->nodes[fg->kernels[p].nodes[0]].attr[0];
        if (c <= gi || c >= m->ngraphs) {
          cg_fail(cg, "graph %s calls graph %d, which does not follow it", fg->graph->name, c);
          break;
        }
        if (cg->graphs[c].total_bytes > deepest) deepest = cg->graphs[c].total_bytes;
      }
    if (!cg->opt.memplan) G->total_bytes = G->own_bytes + deepest;
  }
  /* declare the graphs' functions, so calls can refer to later graphs */
  LLVMTypeRef gp[7] = {cg->tpctx, cg->tpp8, cg->tp8, cg->ti64, cg->tpp8, cg->tpp8, cg->tp8};
  for (int gi = 0; gi < m->ngraphs && !cg->failed; gi++) {
    CgGraph *G = &cg->graphs[gi];
    cg_graph_symbol(m->graphs[gi]->name, G->sym, sizeof G->sym);
    for (int o = 0; o < gi; o++)
      if (!strcmp(cg->graphs[o].sym, G->sym))
        cg_fail(cg, "graphs %s and %s have the same symbol %s", m->graphs[o]->name, m->graphs[gi]->name, G->sym);
    char name[200];
    snprintf(name, sizeof name, "graph.%s", m->graphs[gi]->name);
    G->fn = cg_add_function(cg, name, cg->ti32, gp, 7, 1);
  }
  for (int gi = 0; gi < m->ngraphs && !cg->failed; gi++) {
    const FuseGraph *fg = &cg->fr->graphs[gi];
    CgGraph *G = &cg->graphs[gi];
    G->kfn = xalloc_calloc((size_t)fg->nkernels + 1, sizeof(LLVMValueRef));
    G->kacc = xalloc_calloc((size_t)fg->nkernels + 1, sizeof(LLVMValueRef));
    G->acc_out = xalloc_calloc((size_t)fg->graph->nnodes + 1, 1);
    for (int p = 0; p < fg->nkernels && !cg->failed; p++)
      if (cg_kernel_has_code(fg, p)) {
        G->kfn[p] = cg_kernel_build(cg, gi, p, 0);
        cg->stats.kernels++;
        if (cg->opt.export_kernels && G->kfn[p]) build_kernel_entry(cg, gi, p);
        int v = fuse_grad_acc_output(fg, m, p);
        if (v >= 0 && G->kfn[p]) {
          G->kacc[p] = cg_kernel_build(cg, gi, p, 1);
          G->acc_out[v] = 1;
        }
      }
  }
  for (int gi = 0; gi < m->ngraphs && !cg->failed; gi++) build_graph(cg, gi);
  for (int gi = 0; gi < m->ngraphs && !cg->failed; gi++) build_entry(cg, gi);
  if (!cg->failed) build_descriptor(cg);
  cg->stats.generate = now() - t0;
  if (cg->failed) return -1;
  t0 = now();
  CG_CHECK_MSG(cg, -1, "LLVMVerifyModule", LLVMVerifyModule(cg->mod, LLVMReturnStatusAction, &cg_msg_));
  cg->stats.verify = now() - t0;
  cg->stats.functions = 0;
  for (LLVMValueRef f = LLVMGetFirstFunction(cg->mod); f; f = LLVMGetNextFunction(f)) cg->stats.functions++;
  if (cg->opt.no_opt) return 0;
  t0 = now();
  int level = cg->opt.opt_level > 0 && cg->opt.opt_level <= 3 ? cg->opt.opt_level : 3;
  char pipeline[32];
  snprintf(pipeline, sizeof pipeline, "default<O%d>", level);
  LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
  LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
  LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
  LLVMPassBuilderOptionsSetLoopInterleaving(po, 1);
  /* Unrolling doubles the compile time and made no kernel measurably faster (the
   * vectoriser interleaves already): off unless asked for. */
  LLVMPassBuilderOptionsSetLoopUnrolling(po, cg->opt.unroll);
  LLVMErrorRef e = LLVMRunPasses(cg->mod, pipeline, cg->tm, po);
  LLVMDisposePassBuilderOptions(po);
  CG_CHECK_ERR(cg, -1, "LLVMRunPasses", e);
  cg->stats.optimize = now() - t0;
  return 0;
}

/* Runs argv (the system C compiler); 0 when it exits 0. */
static int run_tool(CgCpu *cg, char **argv) {
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
  if (rc) {
    cg_fail(cg, "cannot run %s: %s (set HPDL_CC to a C compiler)", argv[0], strerror(rc));
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      cg_fail(cg, "waiting for %s: %s", argv[0], strerror(errno));
      return -1;
    }
  if (!WIFEXITED(status) || WEXITSTATUS(status)) {
    cg_fail(cg, "%s failed to link the library (exit status %d)", argv[0],
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return -1;
  }
  return 0;
}

static int emit_object(CgCpu *cg, char *obj) {
  CG_CHECK_MSG(cg, -1, "LLVMTargetMachineEmitToFile",
               LLVMTargetMachineEmitToFile(cg->tm, cg->mod, obj, LLVMObjectFile, &cg_msg_));
  return 0;
}

static int cpu_emit(CgTarget *t, const char *path) {
  CgCpu *cg = (CgCpu *)t;
  if (!cg->generated && cpu_generate(t)) return -1;
  if (cg->failed) return -1;
  size_t plen = strlen(path) + 16;
  char *obj = xalloc_calloc(plen, 1);
  snprintf(obj, plen, "%s.o", path);
  double t0 = now();
  if (emit_object(cg, obj)) {
    free(obj);
    return -1;
  }
  cg->stats.codegen = now() - t0;
  t0 = now();
  const char *cc = cg->opt.cc ? cg->opt.cc : getenv("HPDL_CC");
  if (!cc || !*cc) cc = "cc";
  const char *flags = cg->opt.link_flags ? cg->opt.link_flags : "-lopenblas -lm";
  char *fl = strdup(flags);
  char *argv[64];
  int argc = 0;
  argv[argc++] = (char *)cc;
  argv[argc++] = "-shared";
  argv[argc++] = "-o";
  argv[argc++] = (char *)path;
  argv[argc++] = obj;
  for (char *tok = strtok(fl, " \t"); tok && argc < 62; tok = strtok(NULL, " \t")) argv[argc++] = tok;
  argv[argc] = NULL;
  int rc = run_tool(cg, argv);
  unlink(obj);
  free(fl);
  free(obj);
  cg->stats.link = now() - t0;
  return rc;
}

static char *cpu_dump(CgTarget *t) {
  CgCpu *cg = (CgCpu *)t;
  char *s = LLVMPrintModuleToString(cg->mod);
  char *copy = strdup(s ? s : "");
  if (s) LLVMDisposeMessage(s);
  return copy;
}

static const char *cpu_error(const CgTarget *t) {
  const CgCpu *cg = (const CgCpu *)t;
  return cg->failed ? cg->err : NULL;
}

static const CgStats *cpu_stats(const CgTarget *t) { return &((const CgCpu *)t)->stats; }

static void cpu_destroy(CgTarget *t) {
  CgCpu *cg = (CgCpu *)t;
  if (!cg) return;
  if (cg->graphs)
    for (int gi = 0; gi < cg->m->ngraphs; gi++) {
      CgGraph *G = &cg->graphs[gi];
      free(G->offset);
      free(G->stash);
      free(G->callws);
      free(G->inplace_of);
      free(G->scratch);
      free(G->scratch_bytes);
      free(G->out_slot);
      free(G->kfn);
      free(G->kacc);
      free(G->acc_out);
    }
  free(cg->graphs);
  if (cg->tm) LLVMDisposeTargetMachine(cg->tm);
  if (cg->b) LLVMDisposeBuilder(cg->b);
  if (cg->mod) LLVMDisposeModule(cg->mod);
  if (cg->ctx) LLVMContextDispose(cg->ctx);
  if (cg->triple) LLVMDisposeMessage(cg->triple);
  if (cg->cpu) {
    if (cg->opt.cpu) free(cg->cpu);
    else LLVMDisposeMessage(cg->cpu);
  }
  if (cg->features) {
    if (cg->opt.features) free(cg->features);
    else LLVMDisposeMessage(cg->features);
  }
  free(cg);
}

static const CgBackend cpu_backend = {
    "cpu", cpu_create, cpu_generate, cpu_emit, cpu_dump, cpu_error, cpu_stats, cpu_destroy,
};

const CgBackend *cg_cpu_backend(void) { return &cpu_backend; }
