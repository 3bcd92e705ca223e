/* codegen_cpu_kernel.c - one LLVM function per fused kernel.
 *
 * Every kernel function has the signature
 *     i32 kernel(hpd_ctx *ctx, i8 *scratch, i64 layer, i8 *noalias io...)
 * with one pointer per kernel input, then one per output (fuse.h's lists,
 * ascending node ids); it returns 0, or 1 with ctx->error set (an embedding
 * id or a cross-entropy target out of range, a failed collective).
 *
 * Loop, row, copy and fill kernels are all built by one engine, the nest:
 * an iteration space D, the axes swept for reductions (a row kernel's
 * reduced group; for a loop kernel all of D), a small expression DAG and
 * the stores of the kernel's outputs. Each read of memory is an affine
 * function of D's indices, composed through the index maps fusion folded
 * in (transpose, slice, expand, reshape, repeat_kv's head division) and
 * numpy broadcasting; axes that every access walks contiguously are
 * collapsed, so an elementwise chain over a [B, T, C] tensor is one loop
 * over B*T*C with unit strides, which the loop vectoriser turns into <8 x
 * float> code. A row kernel runs one outer iteration per row and sweeps the
 * row once per level of reduction (a layernorm: mean; variance; output), the
 * schedule of Apex's / llm.c's fused layernorm. Reductions accumulate in
 * fp32 by default (CgOptions.acc_f64 for fp64): the vectoriser keeps 8-32
 * partial sums, which is more accurate than one sequential sum; the loop is
 * marked llvm.loop.vectorize.enable, which is what lets it reorder the sum.
 *
 * GEMM kernels call cblas_sgemm (once for a batch that folds into the rows,
 * else once per batch matrix, with transposes), with the scale as alpha,
 * and run their epilogue (bias, relu / gelu) as a nest over the output.
 * Special kernels (embedding, rope, cross-entropy, pick and their
 * backwards, repeat_kv_bwd, multi-group sum_to) are written out by hand;
 * comm kernels call the runtime's collectives through hpd_ctx. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_cpu_int.h"
#include "hostop.h"
#include "gemm.h"
#include "nest.h"
#include "xalloc.h"

static const IrNode *nd(const CgKern *k, int id) { return &k->g->nodes[id]; }
static int in_kernel(const CgKern *k, int id) { return k->fg->kernel_of[id] == k->kp; }
static int64_t numel(const IrNode *n) { return ir_numel(n); }

/* The nest (nest.h) under the short names this file uses. */
typedef NestAff Aff;
typedef NestX X;
typedef NestStore Store;

static void nest_fail_cb(void *be, const char *msg) { cg_fail(((CgKern *)be)->cg, "%s", msg); }

/* The io index of a value the kernel reads or writes, or -1. */
static int io_index(const CgKern *k, int v) {
  for (int i = 0; i < k->K->ninputs; i++)
    if (k->K->inputs[i] == v) return i;
  for (int i = 0; i < k->K->noutputs; i++)
    if (k->K->outputs[i] == v) return k->K->ninputs + i;
  return -1;
}

/* An element-typed pointer to value v's buffer (an output the plan puts in
 * place of an input: the input's pointer, so loads and stores of the one
 * buffer go through one pointer and the noalias promise holds). */
static LLVMValueRef val_ptr(CgKern *k, int v) {
  CgCpu *cg = k->cg;
  int i = io_index(k, v);
  if (i >= k->K->ninputs && k->inplace_of && k->inplace_of[v] >= 0) {
    int j = io_index(k, k->inplace_of[v]);
    if (j >= 0 && j < k->K->ninputs) i = j;
  }
  if (i < 0) {
    cg_fail(cg, "graph %s kernel k%d: %%%d is neither an input nor an output of the kernel", k->g->name, k->kp, v);
    return LLVMConstNull(cg->tpf32);
  }
  return LLVMBuildBitCast(cg->b, k->io[i], LLVMPointerType(cg_elem_type(cg, nd(k, v)->dtype), 0), "");
}

/* Skips the reshapes folded into this kernel: they are views of memory. */
static int mem_of(const CgKern *k, int v) {
  while (in_kernel(k, v) && nd(k, v)->op == IR_RESHAPE) v = nd(k, v)->in[0];
  return v;
}

/* The block that sets ctx->error and returns 1, made on first use. */
static LLVMBasicBlockRef fail_block(CgKern *k, const char *what) {
  CgCpu *cg = k->cg;
  LLVMBasicBlockRef here = LLVMGetInsertBlock(cg->b);
  LLVMBasicBlockRef bb = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "fail");
  LLVMPositionBuilderAtEnd(cg->b, bb);
  char msg[256];
  snprintf(msg, sizeof msg, "graph %s, kernel k%d: %s", k->g->name, k->kp, what);
  LLVMValueRef s = cg_global_string(cg, msg, "errmsg");
  LLVMValueRef p = LLVMBuildStructGEP2(cg->b, cg->tctx, k->ctxp, CG_CTX_ERROR, "");
  LLVMBuildStore(cg->b, s, p);
  LLVMBuildRet(cg->b, cg_i32(cg, 1));
  LLVMPositionBuilderAtEnd(cg->b, here);
  return bb;
}

/* Branches to `fail` when bad is true; continues in a new block. */
static void fail_if(CgKern *k, LLVMValueRef bad, LLVMBasicBlockRef fail) {
  CgCpu *cg = k->cg;
  LLVMBasicBlockRef ok = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "ok");
  LLVMBuildCondBr(cg->b, bad, fail, ok);
  LLVMPositionBuilderAtEnd(cg->b, ok);
}

/* if (cond) { ... } */
static LLVMBasicBlockRef if_begin(CgKern *k, LLVMValueRef cond) {
  CgCpu *cg = k->cg;
  LLVMBasicBlockRef then = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "then");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "endif");
  LLVMBuildCondBr(cg->b, cond, then, done);
  LLVMPositionBuilderAtEnd(cg->b, then);
  return done;
}

static void if_end(CgKern *k, LLVMBasicBlockRef done) {
  LLVMBuildBr(k->cg->b, done);
  LLVMPositionBuilderAtEnd(k->cg->b, done);
}

/* Loads an index tensor's element as i64 (integers sign-extended, floats truncated). */
static LLVMValueRef load_index(CgKern *k, LLVMValueRef ptr, DType dt, LLVMValueRef i) {
  CgCpu *cg = k->cg;
  LLVMTypeRef et = cg_elem_type(cg, dt);
  LLVMValueRef v = LLVMBuildLoad2(cg->b, et, cg_gep(cg, et, ptr, i, ""), "id");
  if (sem_dtype_is_float(dt))
    return LLVMBuildFPToSI(cg->b, dt == DT_F64 ? v : LLVMBuildFPExt(cg->b, v, cg->tf64, ""), cg->ti64, "");
  return dt == DT_I64 ? v : LLVMBuildSExt(cg->b, v, cg->ti64, "");
}

static LLVMValueRef load_f32(CgKern *k, LLVMValueRef ptr, DType dt, LLVMValueRef i) {
  CgCpu *cg = k->cg;
  LLVMTypeRef et = cg_elem_type(cg, dt);
  return cg_to_f32(cg, LLVMBuildLoad2(cg->b, et, cg_gep(cg, et, ptr, i, ""), ""), dt);
}

static void store_f32(CgKern *k, LLVMValueRef ptr, DType dt, LLVMValueRef i, LLVMValueRef v) {
  CgCpu *cg = k->cg;
  LLVMTypeRef et = cg_elem_type(cg, dt);
  LLVMBuildStore(cg->b, cg_from_f32(cg, v, dt), cg_gep(cg, et, ptr, i, ""));
}

static LLVMValueRef mul64(CgCpu *cg, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildNSWMul(cg->b, a, b, ""); }
static LLVMValueRef add64(CgCpu *cg, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildNSWAdd(cg->b, a, b, ""); }

/* The group's rank and size from ctx (size 0 reads as 1). */
static void group_of(CgKern *k, int64_t g, LLVMValueRef *rank, LLVMValueRef *size) {
  CgCpu *cg = k->cg;
  LLVMValueRef s = cg_ctx_group(cg, k->ctxp, CG_CTX_SIZE, (int)g);
  LLVMValueRef one = cg_i64(cg, 1);
  *size = LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, s, one, ""), one, s, "gsize");
  *rank = cg_ctx_group(cg, k->ctxp, CG_CTX_RANK, (int)g);
}

/* interp_global_pos(1, r, size, local, i) (zigzag; contiguous when size 1). */
static LLVMValueRef zigzag_pos(CgKern *k, LLVMValueRef r, LLVMValueRef size, int64_t local, LLVMValueRef i) {
  CgCpu *cg = k->cg;
  LLVMValueRef h = cg_i64(cg, local / 2);
  LLVMValueRef first = add64(cg, mul64(cg, r, h), i);
  LLVMValueRef other =
      LLVMBuildSub(cg->b, LLVMBuildSub(cg->b, mul64(cg, size, cg_i64(cg, 2)), cg_i64(cg, 1), ""), r, "");
  LLVMValueRef second = add64(cg, mul64(cg, other, h), LLVMBuildSub(cg->b, i, h, ""));
  LLVMValueRef zz = LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, i, h, ""), first, second, "");
  LLVMValueRef contiguous = add64(cg, mul64(cg, r, cg_i64(cg, local)), i);
  return LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLE, size, cg_i64(cg, 1), ""), contiguous, zz, "pos");
}

/* The global position of column `col` of keys gathered around a ring of
 * `size` ranks (ring attention): block b = col / len came from rank r - b,
 * and holds that rank's zigzag chunks; len = cols / size. */
static LLVMValueRef ring_col_pos(CgKern *k, LLVMValueRef r, LLVMValueRef size, int64_t cols, LLVMValueRef col) {
  CgCpu *cg = k->cg;
  LLVMValueRef len = LLVMBuildSDiv(cg->b, cg_i64(cg, cols), size, "len");
  LLVMValueRef blk = LLVMBuildSDiv(cg->b, col, len, "blk");
  LLVMValueRef owner = LLVMBuildSRem(cg->b, add64(cg, LLVMBuildSub(cg->b, r, blk, ""), size), size, "owner");
  LLVMValueRef i = LLVMBuildSRem(cg->b, col, len, "");
  LLVMValueRef h = LLVMBuildSDiv(cg->b, len, cg_i64(cg, 2), "h");
  LLVMValueRef first = add64(cg, mul64(cg, owner, h), i);
  LLVMValueRef other =
      LLVMBuildSub(cg->b, LLVMBuildSub(cg->b, mul64(cg, size, cg_i64(cg, 2)), cg_i64(cg, 1), ""), owner, "");
  LLVMValueRef second = add64(cg, mul64(cg, other, h), LLVMBuildSub(cg->b, i, h, ""));
  LLVMValueRef zz = LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, i, h, ""), first, second, "");
  return LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLE, size, cg_i64(cg, 1), ""), col, zz, "colpos");
}

/* A max reduction over floats as a max over ints: the key below orders
 * like the floats (negative ones have their magnitude bits flipped), and the
 * loop vectoriser turns an integer max into vector code without the
 * no-NaNs / no-signed-zeros promises a float max would need (which LLVM
 * 14's C API cannot put on an instruction). -0 sorts below +0; a NaN with
 * the sign bit clear wins, as it would in a sum. */
static LLVMValueRef float_key(CgCpu *cg, LLVMValueRef x) {
  LLVMValueRef b = LLVMBuildBitCast(cg->b, x, cg->ti32, "");
  LLVMValueRef m = LLVMBuildAnd(cg->b, LLVMBuildAShr(cg->b, b, cg_i32(cg, 31), ""), cg_i32(cg, 0x7fffffff), "");
  return LLVMBuildXor(cg->b, b, m, "key");
}

static LLVMValueRef key_float(CgCpu *cg, LLVMValueRef k) {
  LLVMValueRef m = LLVMBuildAnd(cg->b, LLVMBuildAShr(cg->b, k, cg_i32(cg, 31), ""), cg_i32(cg, 0x7fffffff), "");
  return LLVMBuildBitCast(cg->b, LLVMBuildXor(cg->b, k, m, ""), cg->tf32, "max");
}

static LLVMValueRef key_max(CgCpu *cg, LLVMValueRef acc, LLVMValueRef key) {
  return LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSGT, key, acc, ""), key, acc, "");
}

/* key(-inf) */
static LLVMValueRef key_ninf(CgCpu *cg) { return cg_i32(cg, (int32_t)(0xff800000u ^ 0x7fffffffu)); }

/* An affine form's value at the current loop indices (axes not in scope are 0). */
static LLVMValueRef aff_eval(Nest *N, const Aff *a) {
  CgCpu *cg = ((CgKern *)N->src->be)->cg;
  LLVMValueRef v = cg_i64(cg, a->c);
  for (int t = 0; t < N->na; t++) {
    int64_t c = a->coef[N->alast[t]];
    if (!c || !N->iv[t]) continue;
    v = add64(cg, v, c == 1 ? N->iv[t] : mul64(cg, N->iv[t], cg_i64(cg, c)));
  }
  if (a->dax >= 0 && a->dcoef) {
    int t = N->axis_of[a->dax];
    if (t >= 0 && N->iv[t]) {
      LLVMValueRef q = LLVMBuildUDiv(cg->b, N->iv[t], cg_i64(cg, a->dq), "");
      v = add64(cg, v, mul64(cg, q, cg_i64(cg, a->dcoef)));
    }
  }
  return v;
}

/* Opens a loop of `trip` iterations and returns its index; when `part` is
 * set and a kernel body is being built (k->part_lo), the loop runs over the
 * body's range only: units [lo, hi) of part_unit iterations (the last unit
 * short). */
static LLVMValueRef open_part_loop(CgKern *k, CgLoop *l, int64_t trip, int part, int ncarry, const LLVMValueRef *init,
                                  const char *name) {
  CgCpu *cg = k->cg;
  if (!part || !k->part_lo) {
    cg_loop_open(cg, l, cg_i64(cg, trip), ncarry, init, name);
    return l->iv;
  }
  LLVMValueRef unit = cg_i64(cg, k->part_unit);
  LLVMValueRef start = k->part_unit == 1 ? k->part_lo : mul64(cg, k->part_lo, unit);
  LLVMValueRef end = k->part_hi;
  if (k->part_unit != 1) {
    end = mul64(cg, k->part_hi, unit);
    LLVMValueRef over = LLVMBuildICmp(cg->b, LLVMIntSGT, end, cg_i64(cg, trip), "");
    end = LLVMBuildSelect(cg->b, over, cg_i64(cg, trip), end, "end");
  }
  cg_loop_open(cg, l, LLVMBuildSub(cg->b, end, start, "count"), ncarry, init, name);
  return add64(cg, start, l->iv);
}

/* ---- evaluation ---- */

static LLVMValueRef splitmix_step(CgCpu *cg, LLVMValueRef s, LLVMValueRef *state_out) {
  LLVMValueRef z = LLVMBuildAdd(cg->b, s, LLVMConstInt(cg->ti64, 0x9E3779B97F4A7C15ull, 0), "");
  if (state_out) *state_out = z;
  z = LLVMBuildMul(cg->b, LLVMBuildXor(cg->b, z, LLVMBuildLShr(cg->b, z, cg_i64(cg, 30), ""), ""),
                   LLVMConstInt(cg->ti64, 0xBF58476D1CE4E5B9ull, 0), "");
  z = LLVMBuildMul(cg->b, LLVMBuildXor(cg->b, z, LLVMBuildLShr(cg->b, z, cg_i64(cg, 27), ""), ""),
                   LLVMConstInt(cg->ti64, 0x94D049BB133111EBull, 0), "");
  return LLVMBuildXor(cg->b, z, LLVMBuildLShr(cg->b, z, cg_i64(cg, 31), ""), "");
}

/* interp_hash_name(seed ^ stream * phi, "dropout", layer), computed once per kernel call. */
static LLVMValueRef dropout_base(CgKern *k, int64_t stream) {
  CgCpu *cg = k->cg;
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = "dropout"; *p; p++) {
    h ^= (unsigned char)*p;
    h *= 0x100000001b3ull;
  }
  LLVMValueRef seed = cg_ctx_field(cg, k->ctxp, CG_CTX_SEED, "seed");
  LLVMValueRef s = LLVMBuildXor(cg->b, seed, LLVMConstInt(cg->ti64, (uint64_t)stream * 0x9E3779B97F4A7C15ull, 0), "");
  s = LLVMBuildXor(cg->b, s, LLVMConstInt(cg->ti64, h, 0), "");
  LLVMValueRef a = splitmix_step(cg, s, NULL);
  s = LLVMBuildXor(cg->b, a, LLVMBuildMul(cg->b, k->layer, LLVMConstInt(cg->ti64, 0xD1B54A32D192ED03ull, 0), ""), "");
  return splitmix_step(cg, s, NULL);
}

static LLVMValueRef x_eval(Nest *N, int xi) {
  CgKern *k = N->src->be;
  CgCpu *cg = k->cg;
  X *x = &N->x[xi];
  if ((x->full || (N->columns && x->kind != X_RED)) ? x->vsweep == N->sweep_id : x->v != NULL) return x->v;
  if (!x->full && x->kind == X_RED) {
    cg_fail(cg, "graph %s kernel k%d: a reduction is read before its sweep", k->g->name, k->kp);
    return cg_f32(cg, 0);
  }
  LLVMValueRef v = NULL;
  switch (x->kind) {
  case X_CONST: v = cg_f32(cg, x->p); break;
  case X_LOAD: v = load_f32(k, val_ptr(k, x->mem), x->dt, aff_eval(N, &x->off)); break;
  case X_UN: v = cg_unary(cg, x->op, x->p, x_eval(N, x->a)); break;
  case X_BIN:
    if (x->op == IR_DIV && N->x[x->b].recip) {
      /* a row-level divisor (softmax's sum): one division per row, then products */
      v = LLVMBuildFMul(cg->b, x_eval(N, x->a), N->x[x->b].rv, "");
      break;
    }
    v = cg_binary(cg, x->op, x_eval(N, x->a), x_eval(N, x->b));
    break;
  case X_ACTGRAD:
    v = LLVMBuildFMul(cg->b, cg_unary_deriv(cg, x->op, x->p, x_eval(N, x->a)), x_eval(N, x->b), "");
    break;
  case X_CASTI: v = cg_trunc(cg, x_eval(N, x->a)); break;
  case X_ROUND: v = cg_to_f32(cg, cg_from_f32(cg, x_eval(N, x->a), x->dt), x->dt); break;
  case X_INDEX: v = LLVMBuildSIToFP(cg->b, aff_eval(N, &x->off), cg->tf32, ""); break;
  case X_MASK: {
    LLVMValueRef in = x_eval(N, x->a);
    int tr = N->axis_of[N->R - 2], tc = N->axis_of[N->R - 1];
    LLVMValueRef row = tr >= 0 && N->iv[tr] ? N->iv[tr] : cg_i64(cg, 0);
    LLVMValueRef col = tc >= 0 && N->iv[tc] ? N->iv[tc] : cg_i64(cg, 0);
    if (x->attr) row = zigzag_pos(k, x->pre, x->pre2, N->D[N->R - 2], row);
    if (x->attr_cols) col = ring_col_pos(k, x->pre, x->pre2, N->D[N->R - 1], col);
    LLVMValueRef above = LLVMBuildICmp(cg->b, LLVMIntSGT, col, row, "");
    v = LLVMBuildSelect(cg->b, above, cg_f32(cg, x->p), in, "");
    break;
  }
  case X_VMASK: {
    /* the vocabulary's padding: global column >= below reads as the fill */
    LLVMValueRef in = x_eval(N, x->a), col = aff_eval(N, &x->off);
    if (x->attr) col = add64(cg, mul64(cg, (LLVMValueRef)x->pre, cg_i64(cg, x->cols)), col);
    LLVMValueRef pad = LLVMBuildICmp(cg->b, LLVMIntSGE, col, cg_i64(cg, x->below), "");
    v = LLVMBuildSelect(cg->b, pad, cg_f32(cg, x->p), in, "");
    break;
  }
  case X_DROP: {
    LLVMValueRef in = x_eval(N, x->a);
    if (x->p >= 1) {
      v = cg_f32(cg, 0);
      break;
    }
    LLVMValueRef i = aff_eval(N, &x->off);
    LLVMValueRef st =
        LLVMBuildXor(cg->b, x->pre, LLVMBuildMul(cg->b, i, LLVMConstInt(cg->ti64, 0xD1B54A32D192ED03ull, 0), ""), "");
    LLVMValueRef z = splitmix_step(cg, st, NULL);
    LLVMValueRef u =
        LLVMBuildFMul(cg->b, LLVMBuildUIToFP(cg->b, LLVMBuildLShr(cg->b, z, cg_i64(cg, 11), ""), cg->tf64, ""),
                      cg_f64(cg, 0x1.0p-53), "");
    LLVMValueRef keep = LLVMBuildFCmp(cg->b, LLVMRealOGE, u, cg_f64(cg, x->p), "");
    v = LLVMBuildSelect(cg->b, keep, LLVMBuildFDiv(cg->b, in, cg_f32(cg, 1.0 - x->p), ""), cg_f32(cg, 0), "");
    break;
  }
  case X_RED: break; /* set at the end of its sweep */
  }
  x->v = v;
  x->vsweep = N->sweep_id;
  return v;
}

/* The stores selected by want(): every value is computed before the first
 * store, so an output written in place of an input (memplan.h) never
 * clobbers an element another output still reads. */
static void do_stores(Nest *N, int full, int sweep, int level) {
  CgKern *k = N->src->be;
  CgCpu *cg = k->cg;
  LLVMValueRef *v = calloc((size_t)N->nst + 1, sizeof(LLVMValueRef));
  if (!v) abort();
  for (int i = 0; i < N->nst; i++) {
    Store *s = &N->st[i];
    if (s->full != full || (full ? s->sweep != sweep : N->x[s->x].level != level)) continue;
    v[i] = x_eval(N, s->x);
  }
  for (int i = 0; i < N->nst; i++) {
    Store *s = &N->st[i];
    if (!v[i]) continue;
    LLVMValueRef p = val_ptr(k, s->val);
    LLVMValueRef at = aff_eval(N, &s->off);
    LLVMValueRef x = v[i];
    if (s->add) x = LLVMBuildFAdd(cg->b, load_f32(k, p, s->dt, at), x, "");
    store_f32(k, p, s->dt, at, x);
  }
  free(v);
}

/* Evaluates the row-level expressions of level `level` (and the
 * reciprocals of those that divide) and does their stores. */
static void outer_eval(Nest *N, int level) {
  CgCpu *cg = ((CgKern *)N->src->be)->cg;
  for (int i = 0; i < N->nx; i++) {
    X *x = &N->x[i];
    if (x->full || x->level != level) continue;
    if (x->kind != X_RED) x_eval(N, i);
    if (x->recip && x->v) x->rv = LLVMBuildFDiv(cg->b, cg_f32(cg, 1.0), x->v, "recip");
  }
  do_stores(N, 0, 0, level);
}

/* The column schedule of a row kernel whose reduced axes are not the
 * innermost (a bias gradient: sum_to over [B, T] of [B, T, C]; a weight
 * gradient summed over the batch): walking a column per output element
 * would stride through memory, so the group loops run outside and the
 * trailing axes inside, and each reduction keeps one accumulator per
 * trailing position: the output element itself when the reduction is an
 * fp32 sum or mean the kernel writes out, else a slot of the kernel's
 * scratch (cg_kernel_scratch reserves them); a last loop over the trailing
 * positions finishes the reductions and what follows them. Used when one
 * sweep does (no reduction reads another) and the reduced group is long
 * (>= 16) or the accumulators fit in L2 (1 MiB): a batch of 4 summed over
 * a 38M-element weight gradient streams better row by row. */
enum { COLUMN_MIN_GROUP = 16, COLUMN_L2_BYTES = 1 << 20 };

/* The store that accumulates reduction xi in place, or NULL. */
static Store *direct_store(Nest *N, int xi) {
  const X *x = &N->x[xi];
  if (x->redmax || ((CgKern *)N->src->be)->cg->opt.acc_f64) return NULL;
  for (int i = 0; i < N->nst; i++) {
    Store *s = &N->st[i];
    if (s->x == xi && !s->full && !s->add && s->dt == DT_F32) return s;
  }
  return NULL;
}

static int columns_ok(Nest *N, int nsw, int64_t *inner) {
  *inner = 1;
  int64_t group = 1;
  int has_group = 0, has_trailing = 0, nred = 0, nslots = 0;
  for (int t = 0; t < N->na; t++) {
    if (N->aset[t] == 1) {
      has_group = 1;
      group *= N->adim[t];
    }
    if (N->aset[t] == 2) {
      has_trailing = 1;
      *inner *= N->adim[t];
    }
  }
  for (int i = 0; i < N->nx; i++)
    if (N->x[i].kind == X_RED) {
      nred++;
      nslots += direct_store(N, i) == NULL;
    }
  if (!has_group || !has_trailing || nsw != 1 || nred == 0 || nred > CG_MAX_CARRY) return 0;
  if (group < COLUMN_MIN_GROUP && nred * *inner * 8 > COLUMN_L2_BYTES) return 0;
  return nslots * *inner * 8 <= N->scratch_bytes;
}

/* Opens loops over the new axes of one set (ascending), recording their
 * indices; returns how many. */
static int open_set(Nest *N, CgLoop *l, int set, const char *name) {
  CgKern *k = N->src->be;
  int n = 0;
  for (int t = 0; t < N->na; t++)
    if (N->aset[t] == set) {
      int part = k->part_where == CG_PART_COLUMN && k->part_axis == t;
      N->iv[t] = open_part_loop(k, &l[n++], N->adim[t], part, 0, NULL, name);
    }
  return n;
}

static void close_set(Nest *N, CgLoop *l, int n, int set) {
  for (int q = n - 1; q >= 0; q--) cg_loop_close(((CgKern *)N->src->be)->cg, &l[q], NULL, 0, NULL);
  for (int t = 0; t < N->na; t++)
    if (N->aset[t] == set) N->iv[t] = NULL;
}

/* The linear index of the current trailing position. */
static LLVMValueRef trailing_index(Nest *N) {
  CgCpu *cg = ((CgKern *)N->src->be)->cg;
  LLVMValueRef v = cg_i64(cg, 0);
  int64_t stride = 1;
  for (int t = N->na - 1; t >= 0; t--)
    if (N->aset[t] == 2) {
      v = add64(cg, v, mul64(cg, N->iv[t], cg_i64(cg, stride)));
      stride *= N->adim[t];
    }
  return v;
}

/* Where reduction r's accumulator for the current trailing position is. */
static LLVMValueRef column_slot(Nest *N, Store *direct, LLVMValueRef arr, LLVMTypeRef et, int64_t inner,
                                LLVMValueRef ti) {
  CgCpu *cg = ((CgKern *)N->src->be)->cg;
  if (direct) return cg_gep(cg, cg->tf32, val_ptr(N->src->be, direct->val), aff_eval(N, &direct->off), "");
  LLVMValueRef idx[2] = {cg_i64(cg, 0), ti};
  return LLVMBuildInBoundsGEP2(cg->b, LLVMArrayType(et, (unsigned)inner), arr, idx, 2, "");
}

static void nest_emit_columns(Nest *N, int64_t inner) {
  CgKern *k = N->src->be;
  CgCpu *cg = k->cg;
  N->columns = 1;
  for (int i = 0; i < N->nx; i++) N->x[i].recip = 0;
  int reds[CG_MAX_CARRY], nred = 0, nslots = 0;
  for (int i = 0; i < N->nx && nred < CG_MAX_CARRY; i++)
    if (N->x[i].kind == X_RED) reds[nred++] = i;
  LLVMTypeRef at = cg->opt.acc_f64 ? cg->tf64 : cg->tf32;
  /* the accumulators: the output elements, or inner x 8 bytes each in the scratch */
  LLVMValueRef arr[CG_MAX_CARRY];
  Store *direct[CG_MAX_CARRY];
  LLVMTypeRef et[CG_MAX_CARRY];
  for (int r = 0; r < nred; r++) {
    direct[r] = direct_store(N, reds[r]);
    et[r] = N->x[reds[r]].redmax ? cg->ti32 : direct[r] ? cg->tf32 : at;
    arr[r] = NULL;
    if (direct[r]) continue;
    LLVMValueRef p = cg_byte_ptr(cg, k->scratch, cg_i64(cg, (int64_t)nslots++ * inner * 8), "");
    arr[r] = LLVMBuildBitCast(cg->b, p, LLVMPointerType(LLVMArrayType(et[r], (unsigned)inner), 0), "acc");
  }
  CgLoop lo[IR_MAX_RANK], lg[IR_MAX_RANK], lt[IR_MAX_RANK];
  int no = open_set(N, lo, 0, "outer");
  /* initial values */
  int nt = open_set(N, lt, 2, "init");
  LLVMValueRef ti = trailing_index(N);
  for (int r = 0; r < nred; r++) {
    LLVMValueRef p = column_slot(N, direct[r], arr[r], et[r], inner, ti);
    LLVMBuildStore(cg->b, N->x[reds[r]].redmax ? key_ninf(cg) : LLVMConstReal(et[r], 0.0), p);
  }
  close_set(N, lt, nt, 2);
  /* the sweep: group outside, trailing inside */
  int ng = open_set(N, lg, 1, "sweep");
  nt = open_set(N, lt, 2, "column");
  N->sweep_id++;
  ti = trailing_index(N);
  for (int r = 0; r < nred; r++) {
    X *x = &N->x[reds[r]];
    LLVMValueRef p = column_slot(N, direct[r], arr[r], et[r], inner, ti);
    LLVMValueRef old = LLVMBuildLoad2(cg->b, et[r], p, "");
    LLVMValueRef c = x_eval(N, x->a);
    LLVMValueRef nv;
    if (x->redmax) {
      nv = key_max(cg, old, float_key(cg, c));
    } else {
      if (et[r] == cg->tf64) c = LLVMBuildFPExt(cg->b, c, cg->tf64, "");
      nv = LLVMBuildFAdd(cg->b, old, c, "sum");
    }
    LLVMBuildStore(cg->b, nv, p);
  }
  do_stores(N, 1, 1, 0);
  close_set(N, lt, nt, 2);
  close_set(N, lg, ng, 1);
  /* finish: the reductions' values, then what reads them */
  nt = open_set(N, lt, 2, "finish");
  N->sweep_id++;
  ti = trailing_index(N);
  for (int r = 0; r < nred; r++) {
    X *x = &N->x[reds[r]];
    LLVMValueRef v = LLVMBuildLoad2(cg->b, et[r], column_slot(N, direct[r], arr[r], et[r], inner, ti), "");
    if (x->redmax) {
      v = key_float(cg, v);
    } else {
      if (x->div) v = LLVMBuildFDiv(cg->b, v, LLVMConstReal(et[r], (double)x->div), "mean");
      if (et[r] == cg->tf64) v = LLVMBuildFPTrunc(cg->b, v, cg->tf32, "");
    }
    x->v = v;
  }
  do_stores(N, 0, 0, 0);
  do_stores(N, 0, 0, 1);
  close_set(N, lt, nt, 2);
  close_set(N, lo, no, 0);
}

/* A nest without reductions whose innermost axis z is read with a stride
 * while another axis a is read contiguously (a transpose): tiles of
 * TILE x TILE over (a, z), so both the reads and the writes stay within a
 * few cache lines per tile. Returns 0 when it does not apply. */
enum { TILE = 32 };

static int tile_axes(const Nest *N, int nsw, int *pa, int *pz) {
  if (N->na < 2 || nsw != 1) return 0;
  for (int t = 0; t < N->na; t++)
    if (N->aset[t] != 1) return 0;
  for (int i = 0; i < N->nx; i++)
    if (N->x[i].kind == X_RED) return 0;
  int z = N->na - 1, lz = N->alast[z];
  if (N->adim[z] < TILE) return 0;
  for (int i = 0; i < N->nx; i++) {
    const X *x = &N->x[i];
    if (x->kind != X_LOAD || x->off.dax >= 0) continue;
    int64_t cz = x->off.coef[lz];
    if (cz == 0 || cz == 1) continue;
    for (int a = 0; a < z; a++)
      if (x->off.coef[N->alast[a]] == 1 && N->adim[a] >= TILE) {
        *pa = a;
        *pz = z;
        return 1;
      }
  }
  return 0;
}

static void nest_emit_tiled(Nest *N, int a, int z) {
  CgKern *k = N->src->be;
  CgCpu *cg = k->cg;
  CgLoop l[IR_MAX_RANK + 4];
  int n = 0;
  for (int t = 0; t < N->na; t++)
    if (t != a && t != z) {
      int part = k->part_where == CG_PART_OUTER && k->part_axis == t;
      N->iv[t] = open_part_loop(k, &l[n++], N->adim[t], part, 0, NULL, "outer");
    }
  int64_t A = N->adim[a], Z = N->adim[z];
  LLVMValueRef ta0 = open_part_loop(k, &l[n++], (A + TILE - 1) / TILE, k->part_where == CG_PART_TILE, 0, NULL, "tile.a");
  LLVMValueRef a0 = mul64(cg, ta0, cg_i64(cg, TILE));
  cg_loop_open(cg, &l[n++], cg_i64(cg, (Z + TILE - 1) / TILE), 0, NULL, "tile.z");
  LLVMValueRef z0 = mul64(cg, l[n - 1].iv, cg_i64(cg, TILE));
  LLVMValueRef ra = LLVMBuildSub(cg->b, cg_i64(cg, A), a0, ""), rz = LLVMBuildSub(cg->b, cg_i64(cg, Z), z0, "");
  LLVMValueRef ta =
      LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, ra, cg_i64(cg, TILE), ""), ra, cg_i64(cg, TILE), "");
  LLVMValueRef tz =
      LLVMBuildSelect(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, rz, cg_i64(cg, TILE), ""), rz, cg_i64(cg, TILE), "");
  cg_loop_open(cg, &l[n++], ta, 0, NULL, "in.a");
  N->iv[a] = add64(cg, a0, l[n - 1].iv);
  cg_loop_open(cg, &l[n++], tz, 0, NULL, "in.z");
  N->iv[z] = add64(cg, z0, l[n - 1].iv);
  N->sweep_id++;
  do_stores(N, 1, 1, 0);
  for (int q = n - 1; q >= 0; q--) cg_loop_close(cg, &l[q], NULL, 0, NULL);
  for (int t = 0; t < N->na; t++) N->iv[t] = NULL;
}

/* Collapses the nest's axes, gives each full store its sweep and marks the
 * row-level divisors; returns the number of sweeps. No code: the planner
 * below and nest_emit both start with it (it can run twice). */
static int nest_shape(Nest *N) {
  nest_collapse(N);
  int nsw = 0;
  for (int i = 0; i < N->nx; i++)
    if (N->x[i].kind == X_RED && N->x[i].level > nsw) nsw = N->x[i].level;
  for (int i = 0; i < N->nst; i++) {
    Store *s = &N->st[i];
    s->sweep = N->x[s->x].level + 1;
    if (s->full && s->sweep > nsw) nsw = s->sweep;
  }
  for (int i = 0; i < N->nx; i++) {
    X *x = &N->x[i];
    if (x->kind == X_BIN && x->op == IR_DIV && x->full && !N->x[x->b].full) N->x[x->b].recip = 1;
  }
  return nsw;
}

/* An elementwise loop over one collapsed axis runs on the threads in
 * blocks of this many points: 16 KiB of fp32, whole cache lines and vector
 * bodies for every range but the last; the column schedule's columns in
 * blocks of COLUMNS_BLOCK (a cache line's 16 floats, four times). */
enum { ROWS_BLOCK = 4096, COLUMNS_BLOCK = 64 };

/* Which loop of the nest can run over a range on each of the rank's
 * threads, with every iteration's stores its own: the outermost loop of
 * rows (or of tiles of a transpose), or, in an elementwise loop without
 * rows, the first axis (in blocks of ROWS_BLOCK when it is the only one).
 * The column schedule (a bias gradient: sums over the rows) splits its
 * columns instead: each column still adds its rows in order on one
 * thread, so the sums are the same bits for any split. Not a reduction
 * over the whole space. Sets k->part_where / part_axis /
 * part_unit, the units to split (*nunits) and about how many values a call
 * reads and writes (*work); returns 0 when no loop qualifies. */
static int nest_rows_plan(Nest *N, int64_t *nunits, int64_t *work) {
  CgKern *k = N->src->be;
  for (int j = 0; j < N->R; j++)
    if (N->D[j] == 0) return 0;
  int nsw = nest_shape(N);
  int where = CG_PART_NONE, axis = -1;
  int64_t unit = 1, trip = 0;
  int ta, tz;
  int64_t inner;
  if (tile_axes(N, nsw, &ta, &tz)) {
    for (int t = 0; t < N->na && axis < 0; t++)
      if (t != ta && t != tz) where = CG_PART_OUTER, axis = t, trip = N->adim[t];
    if (axis < 0) where = CG_PART_TILE, axis = ta, trip = (N->adim[ta] + TILE - 1) / TILE;
  } else if (columns_ok(N, nsw, &inner)) {
    int ntrail = 0;
    for (int t = 0; t < N->na; t++)
      if (N->aset[t] == 2 && ntrail++ == 0) where = CG_PART_COLUMN, axis = t, trip = N->adim[t];
    unit = ntrail == 1 ? COLUMNS_BLOCK : 1;
  } else {
    for (int pass = 0; pass < 2 && axis < 0; pass++)
      for (int t = 0; t < N->na && axis < 0; t++)
        if (N->aset[t] == (pass ? 2 : 0)) where = CG_PART_OUTER, axis = t, trip = N->adim[t];
    int reduces = 0, ng = 0;
    for (int i = 0; i < N->nx; i++) reduces |= N->x[i].kind == X_RED;
    for (int t = 0; t < N->na; t++) ng += N->aset[t] == 1;
    for (int t = 0; t < N->na && axis < 0 && !reduces; t++)
      if (N->aset[t] == 1) {
        where = CG_PART_SWEEP, axis = t, trip = N->adim[t];
        unit = ng == 1 ? ROWS_BLOCK : 1;
      }
  }
  if (axis < 0) return 0;
  /* every store must move with the split loop: no two ranges write one place */
  for (int i = 0; i < N->nst; i++) {
    const Store *s = &N->st[i];
    if (s->add || !s->off.coef[N->alast[axis]]) return 0;
  }
  *nunits = (trip + unit - 1) / unit;
  if (*nunits < 2) return 0;
  int64_t points = 1;
  for (int t = 0; t < N->na; t++) points *= N->adim[t];
  *work = points * (nsw > 1 ? nsw : 1);
  k->part_where = where;
  k->part_axis = axis;
  k->part_unit = unit;
  return 1;
}

/* Emits the nest at the builder's position. */
static void nest_emit(Nest *N) {
  CgKern *k = N->src->be;
  CgCpu *cg = k->cg;
  if (cg->failed) return;
  for (int j = 0; j < N->R; j++)
    if (N->D[j] == 0) return; /* an empty space: nothing to do */
  int nsw = nest_shape(N);
  /* values computed once per kernel call */
  for (int i = 0; i < N->nx; i++) {
    X *x = &N->x[i];
    if (x->kind == X_DROP && x->p > 0 && x->p < 1) x->pre = dropout_base(k, x->attr);
    /* a mask's group: its rank (and size) from ctx once */
    if ((x->kind == X_MASK && (x->attr || x->attr_cols)) || (x->kind == X_VMASK && x->attr)) {
      LLVMValueRef rank, size;
      group_of(k, (x->attr ? x->attr : x->attr_cols) - 1, &rank, &size);
      x->pre = rank;
      x->pre2 = size;
    }
  }
  int64_t inner;
  int ta, tz;
  if (tile_axes(N, nsw, &ta, &tz)) {
    N->sweep_id++;
    outer_eval(N, 0);
    nest_emit_tiled(N, ta, tz);
    return;
  }
  if (columns_ok(N, nsw, &inner)) {
    nest_emit_columns(N, inner);
    for (int t = 0; t < N->na; t++) N->iv[t] = NULL;
    return;
  }
  /* outer loops: the leading, then the trailing axes outside the group */
  CgLoop outer[IR_MAX_RANK];
  int nouter = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int t = 0; t < N->na; t++)
      if (N->aset[t] == (pass ? 2 : 0)) {
        int part = k->part_where == CG_PART_OUTER && k->part_axis == t;
        N->iv[t] = open_part_loop(k, &outer[nouter++], N->adim[t], part, 0, NULL, "outer");
      }
  N->sweep_id++;
  outer_eval(N, 0);
  int gaxes[IR_MAX_RANK], ng = 0;
  for (int t = 0; t < N->na; t++)
    if (N->aset[t] == 1) gaxes[ng++] = t;
  for (int s = 1; s <= nsw; s++) {
    int reds[CG_MAX_CARRY], nred = 0;
    LLVMValueRef init[CG_MAX_CARRY];
    LLVMTypeRef at = cg->opt.acc_f64 ? cg->tf64 : cg->tf32;
    for (int i = 0; i < N->nx; i++)
      if (N->x[i].kind == X_RED && N->x[i].level == s) {
        if (nred == CG_MAX_CARRY) {
          cg_fail(cg, "graph %s kernel k%d: more than %d reductions in one sweep", k->g->name, k->kp, CG_MAX_CARRY);
          return;
        }
        init[nred] = N->x[i].redmax ? key_ninf(cg) : LLVMConstReal(at, 0.0);
        reds[nred++] = i;
      }
    CgLoop gl[IR_MAX_RANK];
    LLVMValueRef carry[CG_MAX_CARRY];
    memcpy(carry, init, sizeof(LLVMValueRef) * (size_t)nred);
    for (int q = 0; q < ng; q++) {
      int part = k->part_where == CG_PART_SWEEP && k->part_axis == gaxes[q];
      N->iv[gaxes[q]] = open_part_loop(k, &gl[q], N->adim[gaxes[q]], part, nred, carry, "sweep");
      memcpy(carry, gl[q].phi, sizeof(LLVMValueRef) * (size_t)nred);
    }
    N->sweep_id++;
    LLVMValueRef next[CG_MAX_CARRY];
    for (int r = 0; r < nred; r++) {
      X *x = &N->x[reds[r]];
      LLVMValueRef c = x_eval(N, x->a);
      if (x->redmax) {
        next[r] = key_max(cg, carry[r], float_key(cg, c));
        continue;
      }
      if (cg->opt.acc_f64) c = LLVMBuildFPExt(cg->b, c, cg->tf64, "");
      next[r] = LLVMBuildFAdd(cg->b, carry[r], c, "sum");
    }
    do_stores(N, 1, s, 0);
    for (int q = ng - 1; q >= 0; q--) {
      LLVMValueRef out[CG_MAX_CARRY];
      cg_loop_close(cg, &gl[q], next, q == ng - 1 && nred > 0 && N->adim[gaxes[q]] >= 8, out);
      N->iv[gaxes[q]] = NULL;
      memcpy(next, out, sizeof(LLVMValueRef) * (size_t)nred);
    }
    N->sweep_id++;
    for (int r = 0; r < nred; r++) {
      X *x = &N->x[reds[r]];
      LLVMValueRef v = next[r];
      if (x->redmax) {
        x->v = key_float(cg, v);
        continue;
      }
      if (x->div) v = LLVMBuildFDiv(cg->b, v, LLVMConstReal(at, (double)x->div), "mean");
      if (cg->opt.acc_f64) v = LLVMBuildFPTrunc(cg->b, v, cg->tf32, "");
      x->v = v;
    }
    outer_eval(N, s);
  }
  for (int q = nouter - 1; q >= 0; q--) cg_loop_close(cg, &outer[q], NULL, 0, NULL);
  for (int t = 0; t < N->na; t++) N->iv[t] = NULL;
}

/* ==== kernels by kind ==== */

/* ---- rows on the rank's threads (hpd_ctx.parallel) ----
 *
 * A kernel whose loop of rows can be split is built as three functions:
 * the body `<kernel>.rows`, i32 (ctx, scratch, layer, i64 lo, i64 hi,
 * io...), the kernel's code with that loop bounded to units [lo, hi); the
 * range `<kernel>.range`, i32 (i8 **env, lo, hi), which calls the body with
 * the pointers env holds; and the kernel itself, which fills env and hands
 * the range to the runtime's hook (or calls it over every unit when the
 * hook is NULL). The body keeps the kernel's noalias parameters, so its
 * loops vectorise as the kernel's did. */
typedef void (*RowsEmit)(CgKern *k, void *arg);

/* Builds the body and the range of kernel k (emit writes the body's code,
 * bounding its split loop through open_part_loop), then at the builder's
 * position in the kernel the call over nunits units; returns its status. */
static LLVMValueRef kernel_rows(CgKern *k, int64_t nunits, int64_t work, RowsEmit emit, void *arg) {
  CgCpu *cg = k->cg;
  int nio = k->K->ninputs + k->K->noutputs;
  const char *kname = LLVMGetValueName(k->fn);
  char name[224];
  LLVMTypeRef *pt = xalloc_calloc((size_t)nio + 5, sizeof(LLVMTypeRef));
  pt[0] = cg->tpctx;
  pt[1] = cg->tp8;
  pt[2] = cg->ti64;
  pt[3] = cg->ti64;
  pt[4] = cg->ti64;
  for (int i = 0; i < nio; i++) pt[5 + i] = cg->tp8;
  snprintf(name, sizeof name, "%s.rows", kname);
  LLVMValueRef body = cg_add_function(cg, name, cg->ti32, pt, nio + 5, 1);
  free(pt);
  cg_fn_attr(cg, body, "noinline");
  for (int i = 0; i < nio; i++) cg_param_attr(cg, body, (unsigned)(5 + i), "noalias");
  /* the body: k's function and parameters are the body's while emit runs */
  LLVMBasicBlockRef here = LLVMGetInsertBlock(cg->b);
  CgKern outer = *k;
  LLVMValueRef *bio = xalloc_calloc((size_t)nio + 1, sizeof(LLVMValueRef));
  for (int i = 0; i < nio; i++) bio[i] = LLVMGetParam(body, (unsigned)(5 + i));
  k->fn = body;
  k->ctxp = LLVMGetParam(body, 0);
  k->scratch = LLVMGetParam(body, 1);
  k->layer = LLVMGetParam(body, 2);
  k->part_lo = LLVMGetParam(body, 3);
  k->part_hi = LLVMGetParam(body, 4);
  k->io = bio;
  k->status_fail = NULL;
  k->fail_bb = NULL;
  LLVMPositionBuilderAtEnd(cg->b, LLVMAppendBasicBlockInContext(cg->ctx, body, "entry"));
  emit(k, arg);
  LLVMBuildRet(cg->b, cg_i32(cg, 0));
  *k = outer;
  free(bio);
  /* the range: unpacks env = {ctx, scratch, layer, io...} */
  LLVMTypeRef rp[3] = {cg->tp8, cg->ti64, cg->ti64};
  snprintf(name, sizeof name, "%s.range", kname);
  LLVMValueRef range = cg_add_function(cg, name, cg->ti32, rp, 3, 1);
  LLVMPositionBuilderAtEnd(cg->b, LLVMAppendBasicBlockInContext(cg->ctx, range, "entry"));
  LLVMValueRef env = LLVMBuildBitCast(cg->b, LLVMGetParam(range, 0), cg->tpp8, "env");
  LLVMValueRef *a = xalloc_calloc((size_t)nio + 5, sizeof(LLVMValueRef));
  for (int i = 0; i < nio + 3; i++) {
    LLVMValueRef v = LLVMBuildLoad2(cg->b, cg->tp8, cg_gep(cg, cg->tp8, env, cg_i64(cg, i), ""), "");
    int at = i < 3 ? i : i + 2;
    a[at] = i == 0 ? LLVMBuildBitCast(cg->b, v, cg->tpctx, "ctx") : i == 2 ? LLVMBuildPtrToInt(cg->b, v, cg->ti64, "layer") : v;
  }
  a[3] = LLVMGetParam(range, 1);
  a[4] = LLVMGetParam(range, 2);
  LLVMBuildRet(cg->b, cg_call(cg, body, a, nio + 5, "rc"));
  free(a);
  /* the kernel: env on its stack, then the hook */
  LLVMPositionBuilderAtEnd(cg->b, here);
  LLVMValueRef envp = LLVMBuildAlloca(cg->b, LLVMArrayType(cg->tp8, (unsigned)(nio + 3)), "env");
  LLVMValueRef env8 = LLVMBuildBitCast(cg->b, envp, cg->tpp8, "");
  for (int i = 0; i < nio + 3; i++) {
    LLVMValueRef v = i == 0   ? LLVMBuildBitCast(cg->b, k->ctxp, cg->tp8, "")
                     : i == 1 ? k->scratch
                     : i == 2 ? LLVMBuildIntToPtr(cg->b, k->layer, cg->tp8, "")
                              : k->io[i - 3];
    LLVMBuildStore(cg->b, v, cg_gep(cg, cg->tp8, env8, cg_i64(cg, i), ""));
  }
  return cg_parallel(cg, k->ctxp, range, LLVMBuildBitCast(cg->b, env8, cg->tp8, ""), cg_i64(cg, nunits),
                     cg_i64(cg, work));
}

/* Returns 1 from the kernel when rc is not 0 (the body set ctx->error). */
static void return_if_failed(CgKern *k, LLVMValueRef rc) { cg_return_if_failed(k->cg, k->fn, rc, cg_i32(k->cg, 1)); }

static void emit_nest_rows(CgKern *k, void *arg) {
  (void)k;
  nest_emit(arg);
}

/* Loop, row, copy and fill kernels: the steps nest.c builds, in order. A
 * kernel of one nest whose rows split (nest_rows_plan) runs them on the
 * rank's threads. */
static void kernel_nest(CgKern *k) {
  NestSteps S;
  nest_build_steps(&S, &k->nk);
  if (S.n == 1 && S.step[0].zero_value < 0) {
    Nest *N = &S.step[0].nest;
    if (S.step[0].loop_row) N->scratch_bytes = cg_kernel_scratch(k->cg, k->gi, k->kp);
    int64_t nunits, work;
    if (nest_rows_plan(N, &nunits, &work)) {
      return_if_failed(k, kernel_rows(k, nunits, work, emit_nest_rows, N));
      k->part_where = CG_PART_NONE;
      nest_free_steps(&S);
      return;
    }
  }
  for (int i = 0; i < S.n; i++) {
    NestStep *st = &S.step[i];
    if (st->zero_value >= 0) {
      const IrNode *n = nd(k, st->zero_value);
      cg_memset0(k->cg, val_ptr(k, st->zero_value), cg_i64(k->cg, numel(n) * cg_elem_bytes(n->dtype)));
      continue;
    }
    if (st->loop_row) st->nest.scratch_bytes = cg_kernel_scratch(k->cg, k->gi, k->kp);
    nest_emit(&st->nest);
  }
  nest_free_steps(&S);
}

/* ---- GEMM ---- */

static LLVMValueRef sgemm_fn(CgCpu *cg) {
  if (!cg->fn_sgemm) {
    LLVMTypeRef p[14] = {cg->ti32,  cg->ti32, cg->ti32,  cg->ti32, cg->ti32, cg->ti32,  cg->tf32,
                         cg->tpf32, cg->ti32, cg->tpf32, cg->ti32, cg->tf32, cg->tpf32, cg->ti32};
    cg->fn_sgemm = cg_add_function(cg, "cblas_sgemm", cg->tvoid, p, 14, 0);
  }
  return cg->fn_sgemm;
}

/* Batch offset (in matrices) of an operand at flat output batch index bi,
 * from its strides per output batch axis (gemm_batch_strides). */
static LLVMValueRef batch_offset(CgCpu *cg, LLVMValueRef bi, int nb_axes, const int64_t *out_batch, const int64_t *s) {
  LLVMValueRef off = cg_i64(cg, 0);
  int64_t inner = 1;
  for (int i = nb_axes - 1; i >= 0; i--) {
    if (s[i]) {
      LLVMValueRef idx =
          LLVMBuildURem(cg->b, LLVMBuildUDiv(cg->b, bi, cg_i64(cg, inner), ""), cg_i64(cg, out_batch[i]), "");
      off = add64(cg, off, mul64(cg, idx, cg_i64(cg, s[i])));
    }
    inner *= out_batch[i];
  }
  return off;
}

/* One call of the product: on fp32 operands the runtime's hpd_ctx.gemm_f32
 * (its blocks fixed by the shape, so the bits do not depend on the thread
 * count), or cblas_sgemm where a host gives no hook; on bf16 ones the
 * runtime's hpd_ctx.gemm_bf16 (core/numeric/gemm16.h). A hook's failure (or
 * gemm_bf16's absence) fails the kernel. */
static void gemm_call(CgKern *k, const GemmPlan *P, int bf16, LLVMValueRef m, LLVMValueRef pa, LLVMValueRef pb,
                      LLVMValueRef pc) {
  CgCpu *cg = k->cg;
  const GemmOperand *A = &P->a, *B = &P->b;
  LLVMValueRef hook;
  LLVMBasicBlockRef done = NULL;
  if (!bf16) { /* hpd_ctx.gemm_f32 when the runtime gives it, else cblas_sgemm */
    hook = cg_ctx_field(cg, k->ctxp, CG_CTX_GEMM_F32, "gemm_f32");
    LLVMBasicBlockRef direct = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "sgemm");
    LLVMBasicBlockRef via = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "gemm_f32");
    done = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "gemm_done");
    LLVMBuildCondBr(cg->b, LLVMBuildIsNull(cg->b, hook, ""), direct, via);
    LLVMPositionBuilderAtEnd(cg->b, direct);
    LLVMValueRef args[14] = {cg_i32(cg, 101), cg_i32(cg, A->trans ? 112 : 111), cg_i32(cg, B->trans ? 112 : 111),
                             LLVMBuildTrunc(cg->b, m, cg->ti32, ""), cg_i32(cg, P->N), cg_i32(cg, P->K),
                             cg_f32(cg, P->alpha), pa, cg_i32(cg, A->cols), pb, cg_i32(cg, B->cols), cg_f32(cg, k->accumulate ? 1.0 : 0.0),
                             pc, cg_i32(cg, P->N)};
    cg_call(cg, sgemm_fn(cg), args, 14, "");
    LLVMBuildBr(cg->b, done);
    LLVMPositionBuilderAtEnd(cg->b, via);
  } else {
    hook = cg_ctx_field(cg, k->ctxp, CG_CTX_GEMM_BF16, "gemm_bf16");
    fail_if(k, LLVMBuildIsNull(cg->b, hook, ""),
            fail_block(k, "a bf16 GEMM, and the runtime gives no hpd_ctx.gemm_bf16 (an older runtime: rebuild it)"));
  }
  LLVMValueRef args[14] = {k->ctxp,
                           cg_i32(cg, A->trans),
                           cg_i32(cg, B->trans),
                           m,
                           cg_i64(cg, P->N),
                           cg_i64(cg, P->K),
                           cg_f32(cg, P->alpha),
                           LLVMBuildBitCast(cg->b, pa, cg->tp8, ""),
                           cg_i64(cg, A->cols),
                           LLVMBuildBitCast(cg->b, pb, cg->tp8, ""),
                           cg_i64(cg, B->cols),
                           cg_f32(cg, k->accumulate ? 1.0 : 0.0),
                           pc,
                           cg_i64(cg, P->N)};
  LLVMValueRef rc = LLVMBuildCall2(cg->b, cg->tgemm16, hook, args, 14, "rc");
  return_if_failed(k, rc);
  if (done) {
    LLVMBuildBr(cg->b, done);
    LLVMPositionBuilderAtEnd(cg->b, done);
  }
}

static void kernel_gemm(CgKern *k) {
  CgCpu *cg = k->cg;
  GemmPlan P;
  if (gemm_plan(&k->nk, &P)) return;
  if (P.bgrad >= 0) { /* fuse.h's rule 8 is asked for by the CUDA back end only */
    nest_fail(&k->nk, "graph %s kernel k%d: the cpu back end has no bias-gradient epilogue (fuse without FuseOptions.bias_grad)",
              k->nk.g->name, k->nk.kp);
    return;
  }
  const IrNode *n = nd(k, P.matmul);
  const GemmOperand *A = &P.a, *B = &P.b;
  LLVMValueRef pa = val_ptr(k, A->mem), pb = val_ptr(k, B->mem), pc = val_ptr(k, P.out);
  int bf16 = nd(k, A->mem)->dtype == DT_BF16;
  LLVMTypeRef ta = cg_elem_type(cg, nd(k, A->mem)->dtype), tb = cg_elem_type(cg, nd(k, B->mem)->dtype);
  if (P.flat) {
    gemm_call(k, &P, bf16, cg_i64(cg, P.nbatch * P.M), pa, pb, pc);
  } else {
    CgLoop l;
    cg_loop_open(cg, &l, cg_i64(cg, P.nbatch), 0, NULL, "batch");
    int64_t sa[IR_MAX_RANK], sb[IR_MAX_RANK];
    gemm_batch_strides(&P, A, sa);
    gemm_batch_strides(&P, B, sb);
    LLVMValueRef ao = mul64(cg, batch_offset(cg, l.iv, P.batch_axes, n->dims, sa), cg_i64(cg, A->rows * A->cols));
    LLVMValueRef bo = mul64(cg, batch_offset(cg, l.iv, P.batch_axes, n->dims, sb), cg_i64(cg, B->rows * B->cols));
    LLVMValueRef co = mul64(cg, l.iv, cg_i64(cg, P.M * P.N));
    gemm_call(k, &P, bf16, cg_i64(cg, P.M), cg_gep(cg, ta, pa, ao, ""), cg_gep(cg, tb, pb, bo, ""),
              cg_gep(cg, cg->tf32, pc, co, ""));
    cg_loop_close(cg, &l, NULL, 0, NULL);
  }
  /* The epilogue after sgemm: bias and activation as a loop over the output. */
  if (!P.epilogue) return;
  Nest N;
  gemm_epilogue(&k->nk, &P, &N);
  nest_emit(&N);
  nest_free(&N);
}

/* ---- special kernels ---- */

static int special_node(const CgKern *k) {
  const FuseKernel *K = k->K;
  for (int j = K->nnodes - 1; j >= 0; j--)
    if (nd(k, K->nodes[j])->op != IR_RESHAPE) return K->nodes[j];
  return K->nodes[K->nnodes - 1];
}

/* Row max and log-sum-exp of x[0..V) (f32; the max loop vectorises). */
static LLVMValueRef row_lse(CgKern *k, LLVMValueRef x, DType dt, LLVMValueRef base, int64_t V) {
  CgCpu *cg = k->cg;
  CgLoop l;
  LLVMValueRef init = key_ninf(cg), mx, s;
  cg_loop_open(cg, &l, cg_i64(cg, V), 1, &init, "max");
  LLVMValueRef v = load_f32(k, x, dt, add64(cg, base, l.iv));
  LLVMValueRef nx = key_max(cg, l.phi[0], float_key(cg, v));
  cg_loop_close(cg, &l, &nx, 1, &mx);
  mx = key_float(cg, mx);
  LLVMTypeRef at = cg->opt.acc_f64 ? cg->tf64 : cg->tf32;
  init = LLVMConstReal(at, 0.0);
  cg_loop_open(cg, &l, cg_i64(cg, V), 1, &init, "sumexp");
  v = cg_exp(cg, LLVMBuildFSub(cg->b, load_f32(k, x, dt, add64(cg, base, l.iv)), mx, ""));
  if (cg->opt.acc_f64) v = LLVMBuildFPExt(cg->b, v, cg->tf64, "");
  nx = LLVMBuildFAdd(cg->b, l.phi[0], v, "");
  cg_loop_close(cg, &l, &nx, 1, &s);
  /* lse in f64: mx + log(s); -inf when the row is all -inf */
  LLVMValueRef s64 = cg->opt.acc_f64 ? s : LLVMBuildFPExt(cg->b, s, cg->tf64, "");
  LLVMValueRef ls = LLVMBuildFPExt(cg->b, cg_log(cg, LLVMBuildFPTrunc(cg->b, s64, cg->tf32, "")), cg->tf64, "");
  LLVMValueRef lse = LLVMBuildFAdd(cg->b, LLVMBuildFPExt(cg->b, mx, cg->tf64, ""), ls, "lse");
  LLVMValueRef ninf = LLVMBuildFCmp(cg->b, LLVMRealOEQ, mx, cg_f32(cg, -INFINITY), "");
  return LLVMBuildSelect(cg->b, ninf, cg_f64(cg, -INFINITY), lse, "");
}

static void special_embedding(CgKern *k, const IrNode *n, int id) {
  CgCpu *cg = k->cg;
  int bwd = n->op == IR_EMBEDDING_BWD;
  int tab = mem_of(k, n->in[0]), ids = mem_of(k, n->in[1]);
  const IrNode *in = nd(k, ids);
  int64_t V = bwd ? n->dims[0] : nd(k, tab)->dims[0], C = bwd ? n->dims[1] : nd(k, tab)->dims[1], ni = numel(in);
  LLVMValueRef src = val_ptr(k, tab), ip = val_ptr(k, ids), out = val_ptr(k, id);
  DType sdt = nd(k, tab)->dtype;
  LLVMValueRef off = cg_i64(cg, 0), total = cg_i64(cg, V);
  if (n->attr[0]) {
    LLVMValueRef r, s;
    group_of(k, n->attr[0] - 1, &r, &s);
    off = mul64(cg, r, cg_i64(cg, V));
    total = mul64(cg, s, cg_i64(cg, V));
  }
  char what[128];
  snprintf(what, sizeof what, "%s id outside the vocabulary", ir_op_name(n->op));
  LLVMBasicBlockRef fail = fail_block(k, what);
  /* .acc (fuse_grad_acc_output): the rows are added into the parameter's gradient as it is */
  if (bwd && !k->accumulate) cg_memset0(cg, out, cg_i64(cg, numel(n) * cg_elem_bytes(n->dtype)));
  CgLoop li, lc;
  cg_loop_open(cg, &li, cg_i64(cg, ni), 0, NULL, "id");
  LLVMValueRef tok = load_index(k, ip, in->dtype, li.iv);
  LLVMValueRef bad = LLVMBuildOr(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, tok, cg_i64(cg, 0), ""),
                                 LLVMBuildICmp(cg->b, LLVMIntSGE, tok, total, ""), "");
  fail_if(k, bad, fail);
  LLVMValueRef row = LLVMBuildSub(cg->b, tok, off, "row");
  LLVMValueRef inside = LLVMBuildAnd(cg->b, LLVMBuildICmp(cg->b, LLVMIntSGE, row, cg_i64(cg, 0), ""),
                                     LLVMBuildICmp(cg->b, LLVMIntSLT, row, cg_i64(cg, V), ""), "inside");
  if (!bwd) {
    /* rows of other ranks' shards read as zeros; the clamp keeps the load in bounds */
    LLVMValueRef rowc = LLVMBuildSelect(cg->b, inside, row, cg_i64(cg, 0), "");
    LLVMValueRef sb = mul64(cg, rowc, cg_i64(cg, C)), ob = mul64(cg, li.iv, cg_i64(cg, C));
    cg_loop_open(cg, &lc, cg_i64(cg, C), 0, NULL, "c");
    LLVMValueRef v = load_f32(k, src, sdt, add64(cg, sb, lc.iv));
    v = LLVMBuildSelect(cg->b, inside, v, cg_f32(cg, 0), "");
    store_f32(k, out, n->dtype, add64(cg, ob, lc.iv), v);
    cg_loop_close(cg, &lc, NULL, 0, NULL);
  } else {
    LLVMBasicBlockRef done = if_begin(k, inside);
    LLVMValueRef ob = mul64(cg, row, cg_i64(cg, C)), sb = mul64(cg, li.iv, cg_i64(cg, C));
    cg_loop_open(cg, &lc, cg_i64(cg, C), 0, NULL, "c");
    LLVMValueRef o = add64(cg, ob, lc.iv);
    LLVMValueRef v =
        LLVMBuildFAdd(cg->b, load_f32(k, out, n->dtype, o), load_f32(k, src, sdt, add64(cg, sb, lc.iv)), "");
    store_f32(k, out, n->dtype, o, v);
    cg_loop_close(cg, &lc, NULL, 0, NULL);
    if_end(k, done);
  }
  cg_loop_close(cg, &li, NULL, 0, NULL);
}

static void special_rope(CgKern *k, const IrNode *n, int id) {
  CgCpu *cg = k->cg;
  if (n->rank != 4 || n->dims[3] % 2) {
    cg_fail(cg, "graph %s kernel k%d: rope needs [B, H, T, D] or [B, T, H, D] with D even", k->g->name, k->kp);
    return;
  }
  int xs = mem_of(k, n->in[0]);
  LLVMValueRef xp = val_ptr(k, xs), out = val_ptr(k, id);
  DType xdt = nd(k, xs)->dtype;
  /* rows of D values: [B, H, T] (position = row % T) or [B, T, H] (position = row / H % T) */
  int64_t H = n->dims[ir_rope_heads_axis(n)], BH = n->dims[0] * H, T = n->dims[ir_rope_pos_axis(n)], D = n->dims[3],
          H2 = D / 2;
  LLVMValueRef ctab = LLVMBuildBitCast(cg->b, k->scratch, cg->tpf32, "cos");
  LLVMValueRef stab = cg_gep(cg, cg->tf32, ctab, cg_i64(cg, T * H2), "sin");
  LLVMValueRef r = NULL, s = NULL;
  if (n->attr[1]) group_of(k, n->attr[1] - 1, &r, &s);
  double sign = n->attr[0] ? -1.0 : 1.0;
  /* the angle table, in double as interp: theta = sign * pos * base^(-2i/D) */
  CgLoop lt, li;
  cg_loop_open(cg, &lt, cg_i64(cg, T), 0, NULL, "t");
  LLVMValueRef pos = n->attr[1] ? zigzag_pos(k, r, s, T, lt.iv) : lt.iv;
  LLVMValueRef posf = LLVMBuildFMul(cg->b, cg_f64(cg, sign), LLVMBuildSIToFP(cg->b, pos, cg->tf64, ""), "");
  cg_loop_open(cg, &li, cg_i64(cg, H2), 0, NULL, "i");
  LLVMValueRef ex =
      LLVMBuildFDiv(cg->b, LLVMBuildFMul(cg->b, cg_f64(cg, -2.0), LLVMBuildSIToFP(cg->b, li.iv, cg->tf64, ""), ""),
                    cg_f64(cg, (double)D), "");
  LLVMValueRef freq = cg_pow64(cg, cg_f64(cg, n->fattr), ex);
  double yf, ylo, yhi;
  if (ir_rope_yarn_range(n, D, &yf, &ylo, &yhi)) {
    /* YaRN's gain, as ir_rope_gain computes it */
    LLVMValueRef ramp = LLVMBuildFDiv(cg->b, LLVMBuildFSub(cg->b, LLVMBuildSIToFP(cg->b, li.iv, cg->tf64, ""), cg_f64(cg, ylo), ""),
                                      cg_f64(cg, yhi - ylo), "ramp");
    ramp = LLVMBuildSelect(cg->b, LLVMBuildFCmp(cg->b, LLVMRealOLT, ramp, cg_f64(cg, 0.0), ""), cg_f64(cg, 0.0), ramp, "");
    ramp = LLVMBuildSelect(cg->b, LLVMBuildFCmp(cg->b, LLVMRealOGT, ramp, cg_f64(cg, 1.0), ""), cg_f64(cg, 1.0), ramp, "");
    LLVMValueRef keep = LLVMBuildFSub(cg->b, cg_f64(cg, 1.0), ramp, "keep");
    LLVMValueRef gain = LLVMBuildFAdd(cg->b, LLVMBuildFDiv(cg->b, LLVMBuildFSub(cg->b, cg_f64(cg, 1.0), keep, ""), cg_f64(cg, yf), ""),
                                      keep, "gain");
    freq = LLVMBuildFMul(cg->b, freq, gain, "");
  }
  LLVMValueRef theta = LLVMBuildFMul(cg->b, posf, freq, "theta");
  LLVMValueRef at = add64(cg, mul64(cg, lt.iv, cg_i64(cg, H2)), li.iv);
  LLVMBuildStore(cg->b, LLVMBuildFPTrunc(cg->b, cg_cos64(cg, theta), cg->tf32, ""), cg_gep(cg, cg->tf32, ctab, at, ""));
  LLVMBuildStore(cg->b, LLVMBuildFPTrunc(cg->b, cg_sin64(cg, theta), cg->tf32, ""), cg_gep(cg, cg->tf32, stab, at, ""));
  cg_loop_close(cg, &li, NULL, 0, NULL);
  cg_loop_close(cg, &lt, NULL, 0, NULL);
  /* the rotation of each pair */
  CgLoop lb;
  cg_loop_open(cg, &lb, cg_i64(cg, BH * T), 0, NULL, "bht");
  LLVMValueRef t = ir_rope_bthd(n) ? LLVMBuildURem(cg->b, LLVMBuildUDiv(cg->b, lb.iv, cg_i64(cg, H), ""), cg_i64(cg, T), "")
                                    : LLVMBuildURem(cg->b, lb.iv, cg_i64(cg, T), "");
  LLVMValueRef rowb = mul64(cg, lb.iv, cg_i64(cg, D)), tb = mul64(cg, t, cg_i64(cg, H2));
  cg_loop_open(cg, &li, cg_i64(cg, H2), 0, NULL, "i");
  LLVMValueRef i0 = add64(cg, rowb, mul64(cg, li.iv, cg_i64(cg, 2))), i1 = add64(cg, i0, cg_i64(cg, 1));
  LLVMValueRef x0 = load_f32(k, xp, xdt, i0), x1 = load_f32(k, xp, xdt, i1);
  LLVMValueRef ti = add64(cg, tb, li.iv);
  LLVMValueRef c = LLVMBuildLoad2(cg->b, cg->tf32, cg_gep(cg, cg->tf32, ctab, ti, ""), "");
  LLVMValueRef sn = LLVMBuildLoad2(cg->b, cg->tf32, cg_gep(cg, cg->tf32, stab, ti, ""), "");
  LLVMValueRef o0 = LLVMBuildFSub(cg->b, LLVMBuildFMul(cg->b, x0, c, ""), LLVMBuildFMul(cg->b, x1, sn, ""), "");
  LLVMValueRef o1 = LLVMBuildFAdd(cg->b, LLVMBuildFMul(cg->b, x0, sn, ""), LLVMBuildFMul(cg->b, x1, c, ""), "");
  store_f32(k, out, n->dtype, i0, o0);
  store_f32(k, out, n->dtype, i1, o1);
  cg_loop_close(cg, &li, NULL, 0, NULL);
  cg_loop_close(cg, &lb, NULL, 0, NULL);
}

typedef struct {
  const IrNode *n;
  int id;
} CeRows;

/* Rows [lo, hi) of a cross-entropy (row p's loss, lse - x[target] in
 * double, into the scratch's p-th double) or of its backward (row p's
 * gradient): every row on its own, so they split over the threads. */
static void ce_rows(CgKern *k, void *arg) {
  CgCpu *cg = k->cg;
  const IrNode *n = ((const CeRows *)arg)->n;
  int id = ((const CeRows *)arg)->id;
  int bwd = n->op == IR_CROSS_ENTROPY_BWD;
  int xs = mem_of(k, n->in[0]), ts = mem_of(k, n->in[1]);
  const IrNode *xn = nd(k, xs), *tn = nd(k, ts);
  int64_t V = nd(k, n->in[0])->dims[nd(k, n->in[0])->rank - 1], P = numel(tn);
  LLVMValueRef xp = val_ptr(k, xs), tp = val_ptr(k, ts), out = val_ptr(k, id);
  char what[128];
  snprintf(what, sizeof what, "%s target outside [0, %" PRId64 ")", ir_op_name(n->op), V);
  LLVMBasicBlockRef fail = fail_block(k, what);
  LLVMValueRef scale = NULL;
  if (bwd) {
    int ds = mem_of(k, n->in[2]);
    LLVMValueRef dl = load_f32(k, val_ptr(k, ds), nd(k, ds)->dtype, cg_i64(cg, 0));
    scale = LLVMBuildFDiv(cg->b, dl, cg_f32(cg, (double)P), "scale");
  }
  CgLoop lp;
  LLVMValueRef row = open_part_loop(k, &lp, P, 1, 0, NULL, "row");
  LLVMValueRef base = mul64(cg, row, cg_i64(cg, V));
  LLVMValueRef tgt = load_index(k, tp, tn->dtype, row);
  LLVMValueRef bad = LLVMBuildOr(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, tgt, cg_i64(cg, 0), ""),
                                 LLVMBuildICmp(cg->b, LLVMIntSGE, tgt, cg_i64(cg, V), ""), "");
  fail_if(k, bad, fail);
  LLVMValueRef lse = row_lse(k, xp, xn->dtype, base, V);
  LLVMValueRef tat = add64(cg, base, tgt);
  if (!bwd) {
    LLVMValueRef xt = LLVMBuildFPExt(cg->b, load_f32(k, xp, xn->dtype, tat), cg->tf64, "");
    LLVMValueRef losses = LLVMBuildBitCast(cg->b, k->scratch, cg->tpf64, "losses");
    LLVMBuildStore(cg->b, LLVMBuildFSub(cg->b, lse, xt, ""), cg_gep(cg, cg->tf64, losses, row, ""));
    cg_loop_close(cg, &lp, NULL, 0, NULL);
    return;
  }
  LLVMValueRef lse32 = LLVMBuildFPTrunc(cg->b, lse, cg->tf32, "");
  CgLoop lv;
  cg_loop_open(cg, &lv, cg_i64(cg, V), 0, NULL, "v");
  LLVMValueRef at = add64(cg, base, lv.iv);
  LLVMValueRef e = cg_exp(cg, LLVMBuildFSub(cg->b, load_f32(k, xp, xn->dtype, at), lse32, ""));
  store_f32(k, out, n->dtype, at, LLVMBuildFMul(cg->b, scale, e, ""));
  cg_loop_close(cg, &lv, NULL, 0, NULL);
  LLVMValueRef et = cg_exp(cg, LLVMBuildFSub(cg->b, load_f32(k, xp, xn->dtype, tat), lse32, ""));
  store_f32(k, out, n->dtype, tat, LLVMBuildFMul(cg->b, scale, LLVMBuildFSub(cg->b, et, cg_f32(cg, 1.0), ""), ""));
  cg_loop_close(cg, &lp, NULL, 0, NULL);
}

/* Cross-entropy and its backward: the rows on the rank's threads; the
 * forward's mean then adds the rows' losses in row order in double, on
 * one thread, so the loss is the same for any thread count. */
static void special_cross_entropy(CgKern *k, const IrNode *n, int id) {
  CgCpu *cg = k->cg;
  int64_t V = nd(k, n->in[0])->dims[nd(k, n->in[0])->rank - 1], P = numel(nd(k, mem_of(k, n->in[1])));
  CeRows arg = {n, id};
  k->part_where = CG_PART_ROWS;
  k->part_unit = 1;
  return_if_failed(k, kernel_rows(k, P, (n->op == IR_CROSS_ENTROPY_BWD ? 3 : 2) * P * V, ce_rows, &arg));
  k->part_where = CG_PART_NONE;
  if (n->op == IR_CROSS_ENTROPY_BWD) return;
  LLVMValueRef losses = LLVMBuildBitCast(cg->b, k->scratch, cg->tpf64, "losses");
  CgLoop lp;
  LLVMValueRef init = cg_f64(cg, 0), total;
  cg_loop_open(cg, &lp, cg_i64(cg, P), 1, &init, "mean");
  LLVMValueRef l = LLVMBuildLoad2(cg->b, cg->tf64, cg_gep(cg, cg->tf64, losses, lp.iv, ""), "");
  LLVMValueRef nt = LLVMBuildFAdd(cg->b, lp.phi[0], l, "");
  cg_loop_close(cg, &lp, &nt, 0, &total);
  LLVMValueRef mean = LLVMBuildFDiv(cg->b, total, cg_f64(cg, (double)P), "");
  store_f32(k, val_ptr(k, id), n->dtype, cg_i64(cg, 0), LLVMBuildFPTrunc(cg->b, mean, cg->tf32, ""));
}

static void special_pick(CgKern *k, const IrNode *n, int id) {
  CgCpu *cg = k->cg;
  int bwd = n->op == IR_PICK_BWD;
  int zs = mem_of(k, n->in[0]), ts = mem_of(k, n->in[1]);
  const IrNode *tn = nd(k, ts);
  int64_t V = bwd ? n->dims[n->rank - 1] : nd(k, n->in[0])->dims[nd(k, n->in[0])->rank - 1], P = numel(tn);
  LLVMValueRef zp = val_ptr(k, zs), tp = val_ptr(k, ts), out = val_ptr(k, id);
  LLVMValueRef off = cg_i64(cg, 0);
  if (n->attr[0]) {
    LLVMValueRef r, s;
    group_of(k, n->attr[0] - 1, &r, &s);
    off = mul64(cg, r, cg_i64(cg, V));
  }
  if (bwd) cg_memset0(cg, out, cg_i64(cg, numel(n) * cg_elem_bytes(n->dtype)));
  CgLoop lp;
  cg_loop_open(cg, &lp, cg_i64(cg, P), 0, NULL, "p");
  LLVMValueRef kk = LLVMBuildSub(cg->b, load_index(k, tp, tn->dtype, lp.iv), off, "");
  LLVMValueRef inside = LLVMBuildAnd(cg->b, LLVMBuildICmp(cg->b, LLVMIntSGE, kk, cg_i64(cg, 0), ""),
                                     LLVMBuildICmp(cg->b, LLVMIntSLT, kk, cg_i64(cg, V), ""), "");
  LLVMValueRef kc = LLVMBuildSelect(cg->b, inside, kk, cg_i64(cg, 0), "");
  LLVMValueRef at = add64(cg, mul64(cg, lp.iv, cg_i64(cg, V)), kc);
  if (!bwd) {
    LLVMValueRef v = load_f32(k, zp, nd(k, zs)->dtype, at);
    store_f32(k, out, n->dtype, lp.iv, LLVMBuildSelect(cg->b, inside, v, cg_f32(cg, 0), ""));
  } else {
    LLVMBasicBlockRef done = if_begin(k, inside);
    store_f32(k, out, n->dtype, at, load_f32(k, zp, nd(k, zs)->dtype, lp.iv));
    if_end(k, done);
  }
  cg_loop_close(cg, &lp, NULL, 0, NULL);
}

/* repeat_kv_bwd and sum_to over several axis groups: zero the output, then
 * add each input element into the output element it broadcast from. */
static void special_scatter_add(CgKern *k, const IrNode *n, int id) {
  CgCpu *cg = k->cg;
  int xs = n->in[0];
  const IrNode *x = nd(k, xs);
  cg_memset0(cg, val_ptr(k, id), cg_i64(cg, numel(n) * cg_elem_bytes(n->dtype)));
  Nest N;
  nest_init(&N, &k->nk, x->rank, x->dims, 0, 0, 0, x->rank);
  Aff e[IR_MAX_RANK];
  for (int j = 0; j < x->rank; j++) e[j] = x->dims[j] == 1 ? nest_aff_const(0) : nest_aff_axis(j);
  int xi = nest_x_read(&N, e, x->rank, xs);
  Aff off = nest_aff_const(0);
  if (n->op == IR_REPEAT_KV_BWD) {
    /* output head h / rep of input head h */
    int64_t rep = n->attr[0], os[IR_MAX_RANK];
    nest_row_strides(n->rank, n->dims, os);
    for (int j = 0; j < x->rank; j++)
      if (j != 1 && x->dims[j] != 1) off.coef[j] = os[j];
    off.dax = 1;
    off.dq = rep;
    off.dcoef = os[1];
  } else {
    int64_t s = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
      int kk = n->rank - x->rank + i;
      off.coef[i] = (kk < 0 || n->dims[kk] == 1 || x->dims[i] == 1) ? 0 : s;
      if (kk >= 0) s *= n->dims[kk];
    }
  }
  nest_add_store(&N, xi, id, n->dtype, &off, 1);
  N.pinned[1] = n->op == IR_REPEAT_KV_BWD;
  nest_emit(&N);
  nest_free(&N);
}

/* One call of a runtime hook of hpd_ctx (call_extern, host_op: the same
 * signature) with a table of the kernel's whole-tensor buffers, its inputs
 * then node id's output; a NULL hook or a non-zero return ends the kernel
 * with the message (the hook's own in ctx->error). */
static void call_hook2(CgKern *k, const IrNode *n, int id, int id2, int field, int32_t a1, int32_t a2, const char *missing) {
  CgCpu *cg = k->cg;
  int nb = n->nin + 1 + (id2 >= 0);
  LLVMValueRef bufs = LLVMBuildArrayAlloca(cg->b, cg->tp8, cg_i32(cg, nb), "bufs");
  for (int i = 0; i < nb; i++) {
    LLVMValueRef p = i < n->nin ? val_ptr(k, mem_of(k, n->in[i])) : val_ptr(k, i == n->nin ? id : id2);
    LLVMBuildStore(cg->b, LLVMBuildBitCast(cg->b, p, cg->tp8, ""), cg_gep(cg, cg->tp8, bufs, cg_i64(cg, i), ""));
  }
  LLVMValueRef hook = cg_ctx_field(cg, k->ctxp, field, "hook");
  fail_if(k, LLVMBuildIsNull(cg->b, hook, ""), fail_block(k, missing));
  LLVMValueRef a[4] = {k->ctxp, cg_i32(cg, a1), cg_i32(cg, a2), bufs};
  LLVMValueRef rc = LLVMBuildCall2(cg->b, cg_extern_hook_type(cg), hook, a, 4, "rc");
  return_if_failed(k, rc);
}

static void call_hook(CgKern *k, const IrNode *n, int id, int field, int32_t a1, int32_t a2, const char *missing) {
  call_hook2(k, n, id, -1, field, a1, a2, missing);
}

/* An extern: the runtime's hook (hpd_ctx.call_extern) makes the libffi call
 * on the kernel's buffers, which hold whole f32 tensors (fusion folds only
 * reshapes into a special kernel: mem_of sees through them). */
static void special_extern(CgKern *k, const IrNode *n, int id) {
  call_hook(k, n, id, CG_CTX_CALL_EXTERN, (int32_t)n->attr[0], n->op == IR_EXTERN_GRAD,
            "no extern hook in hpd_ctx (a runtime without extern support)");
}

/* Whether a host op reads input i of type t: f32 and i32, and the fused
 * head's x and w in bf16 under bf16 storage (its GEMMs' operands,
 * core/numeric/lmce.h), and the grouped GEMMs' operands (hostop.c widens them). */
static int host_reads(const IrNode *n, int i, DType t) {
  return t == DT_F32 || t == DT_I32 ||
         (t == DT_BF16 && i < 2 && (ir_linear_role(n->op) != IR_LINEAR_NONE || n->op == IR_GROUPED_MM || n->op == IR_GROUPED_MM_WGRAD));
}

/* An op the runtime computes on the host (hpd_ctx.host_op): the mixture of
 * experts' ops, whose data-dependent slot assignment is a few loops over a
 * small routing table (no vector code to win), and the expert all-to-all.
 * The hook reads the node from the stage's IR; the buffers are whole tensors
 * (core/hostop.h). */
static void special_host(CgKern *k, const IrNode *n, int id) {
  for (int i = 0; i <= n->nin; i++) {
    const IrNode *x = i < n->nin ? nd(k, mem_of(k, n->in[i])) : n;
    if (!host_reads(n, i, x->dtype)) {
      cg_fail(k->cg, "graph %s kernel k%d: %s on the host takes f32 and i32 tensors, not %s", k->g->name, k->kp,
              ir_op_name(n->op), sem_dtype_name(x->dtype));
      return;
    }
  }
  call_hook(k, n, id, CG_CTX_HOST_OP, k->gi, id | (k->accumulate ? HOSTOP_ADD : 0),
            "no host-op hook in hpd_ctx (a runtime older than the artifact)");
}

/* The fused head's gradient pair (fuse.h): one host op makes dx and dw
 * (core/numeric/lmce.c), dw added into the gradient slot in the .acc form. */
static void special_linear_ce_pair(CgKern *k) {
  int dx = -1, dw = -1;
  for (int j = 0; j < k->K->nnodes; j++) {
    int v = k->K->nodes[j];
    if (ir_linear_role(nd(k, v)->op) == IR_LINEAR_DX) dx = v;
    if (ir_linear_role(nd(k, v)->op) == IR_LINEAR_DW) dw = v;
  }
  const IrNode *n = nd(k, dx);
  for (int i = 0; i < n->nin; i++) {
    DType t = nd(k, mem_of(k, n->in[i]))->dtype;
    if (!host_reads(n, i, t)) {
      cg_fail(k->cg, "graph %s kernel k%d: %s on the host takes f32 and i32 tensors, not %s", k->g->name, k->kp,
              ir_op_name(n->op), sem_dtype_name(t));
      return;
    }
  }
  call_hook2(k, n, dx, dw, CG_CTX_HOST_OP, k->gi, dx | HOSTOP_PAIR | (k->accumulate ? HOSTOP_ADD : 0),
             "no host-op hook in hpd_ctx (a runtime older than the artifact)");
}

static void kernel_special(CgKern *k) {
  if (fuse_linear_ce_pair(&k->cg->fr->graphs[k->gi], k->kp)) {
    special_linear_ce_pair(k);
    return;
  }
  int id = special_node(k);
  const IrNode *n = nd(k, id);
  switch (n->op) {
  case IR_EMBEDDING:
  case IR_EMBEDDING_BWD: special_embedding(k, n, id); break;
  case IR_ROPE: special_rope(k, n, id); break;
  case IR_CROSS_ENTROPY:
  case IR_CROSS_ENTROPY_BWD: special_cross_entropy(k, n, id); break;
  case IR_PICK:
  case IR_PICK_BWD: special_pick(k, n, id); break;
  case IR_REPEAT_KV_BWD:
  case IR_SUM_TO:
  case IR_REDUCE_SUM: special_scatter_add(k, n, id); break;
  case IR_EXTERN:
  case IR_EXTERN_GRAD: special_extern(k, n, id); break;
  default:
    if (hostop_supported(n->op)) special_host(k, n, id);
    else cg_fail(k->cg, "graph %s kernel k%d: no CPU kernel for %s", k->g->name, k->kp, ir_op_name(n->op));
    break;
  }
}

/* ---- collectives: through the runtime's callbacks in hpd_ctx ---- */

/* Copies between this rank's chunk (local) of a split axis and its place in
 * the whole (global), for chunk `r` of `size` (interp.c's chunk_copy). */
static void chunk_copy(CgKern *k, const IrNode *local, int64_t axis, int layout, LLVMValueRef r, LLVMValueRef size,
                       LLVMValueRef global, LLVMValueRef loc, int to_global) {
  CgCpu *cg = k->cg;
  LLVMTypeRef elt = cg_elem_type(cg, local->dtype); /* f32, or i32 token chunks */
  int64_t outer = 1, inner = 1, len = local->dims[axis];
  for (int64_t i = 0; i < axis; i++) outer *= local->dims[i];
  for (int i = (int)axis + 1; i < local->rank; i++) inner *= local->dims[i];
  LLVMValueRef glen = mul64(cg, size, cg_i64(cg, len));
  CgLoop lo, li, lc;
  cg_loop_open(cg, &lo, cg_i64(cg, outer), 0, NULL, "o");
  cg_loop_open(cg, &li, cg_i64(cg, len), 0, NULL, "i");
  LLVMValueRef gp = layout ? zigzag_pos(k, r, size, len, li.iv) : add64(cg, mul64(cg, r, cg_i64(cg, len)), li.iv);
  LLVMValueRef gb = mul64(cg, add64(cg, mul64(cg, lo.iv, glen), gp), cg_i64(cg, inner));
  LLVMValueRef lb = mul64(cg, add64(cg, mul64(cg, lo.iv, cg_i64(cg, len)), li.iv), cg_i64(cg, inner));
  cg_loop_open(cg, &lc, cg_i64(cg, inner), 0, NULL, "c");
  LLVMValueRef ga = add64(cg, gb, lc.iv), la = add64(cg, lb, lc.iv);
  LLVMValueRef src = to_global ? cg_gep(cg, elt, loc, la, "") : cg_gep(cg, elt, global, ga, "");
  LLVMValueRef dst = to_global ? cg_gep(cg, elt, global, ga, "") : cg_gep(cg, elt, loc, la, "");
  LLVMBuildStore(cg->b, LLVMBuildLoad2(cg->b, elt, src, ""), dst);
  cg_loop_close(cg, &lc, NULL, 0, NULL);
  cg_loop_close(cg, &li, NULL, 0, NULL);
  cg_loop_close(cg, &lo, NULL, 0, NULL);
}

static LLVMValueRef call_coll(CgKern *k, int field, LLVMValueRef *args, int nargs) {
  CgCpu *cg = k->cg;
  LLVMValueRef fp = cg_ctx_field(cg, k->ctxp, field, "coll");
  LLVMTypeRef ft = cg->tcoll[field - CG_CTX_ALL_REDUCE];
  return LLVMBuildCall2(cg->b, ft, fp, args, (unsigned)nargs, "rc");
}

static void kernel_comm(CgKern *k) {
  CgCpu *cg = k->cg;
  int id = special_node(k);
  const IrNode *n = nd(k, id);
  if (n->op == IR_ALL_TO_ALL) {
    special_host(k, n, id);
    return;
  }
  int xs = n->nin ? mem_of(k, n->in[0]) : -1;
  const IrNode *x = xs >= 0 ? nd(k, xs) : NULL;
  /* What only moves (a slice, a gather, a message, the identity marker) may
   * be 32-bit integers too - the experts' choices gathered over the context
   * group - carried as 4-byte words by the f32 transports; what sums is f32. */
  int moves = n->op == IR_SHARD_SLICE || n->op == IR_ALL_GATHER || n->op == IR_SEND || n->op == IR_RECV ||
              n->op == IR_COPY_TO_GROUP;
  int words = moves && n->dtype == DT_I32 && (!x || x->dtype == DT_I32);
  if (!words && (n->dtype != DT_F32 || (x && x->dtype != DT_F32))) {
    cg_fail(cg, "graph %s kernel k%d: collectives sum f32 only (%s of %s)", k->g->name, k->kp, ir_op_name(n->op),
            sem_dtype_name(n->dtype));
    return;
  }
  int64_t N = numel(n), NX = x ? numel(x) : 0, grp = n->attr[0];
  /* a send whose result nothing reads (a gradient going back to the
   * previous stage) has no buffer: the transfer is all it does */
  int unread = n->op == IR_SEND && io_index(k, id) < 0;
  LLVMValueRef out = unread ? NULL : val_ptr(k, id), xp = x ? val_ptr(k, xs) : NULL;
  if (words) { /* the transports' f32 words */
    if (out) out = LLVMBuildBitCast(cg->b, out, cg->tpf32, "");
    if (xp) xp = LLVMBuildBitCast(cg->b, xp, cg->tpf32, "");
  }
  LLVMValueRef r, s;
  group_of(k, grp, &r, &s);
  char what[128];
  snprintf(what, sizeof what, "%s over %s failed", ir_op_name(n->op), ir_group_name((IrGroup)grp));
  LLVMBasicBlockRef fail = fail_block(k, what);
  LLVMValueRef comm = cg_ctx_field(cg, k->ctxp, CG_CTX_COMM, "comm");
  LLVMValueRef multi = LLVMBuildICmp(cg->b, LLVMIntSGT, s, cg_i64(cg, 1), "multi");
  switch (n->op) {
  case IR_COPY_TO_GROUP: cg_memcpy(cg, out, xp, cg_i64(cg, N * 4)); break;
  case IR_ALL_REDUCE: {
    cg_memcpy(cg, out, xp, cg_i64(cg, N * 4));
    LLVMBasicBlockRef done = if_begin(k, multi);
    LLVMValueRef a[5] = {comm, cg_i32(cg, grp), cg_i32(cg, n->attr[2]), out, cg_i64(cg, N)};
    fail_if(k, LLVMBuildICmp(cg->b, LLVMIntNE, call_coll(k, CG_CTX_ALL_REDUCE, a, 5), cg_i32(cg, 0), ""), fail);
    if_end(k, done);
    break;
  }
  case IR_SHARD_SLICE:
    fail_if(k, LLVMBuildICmp(cg->b, LLVMIntNE, mul64(cg, s, cg_i64(cg, N)), cg_i64(cg, NX), ""), fail);
    chunk_copy(k, n, n->attr[1], (int)n->attr[2], r, s, xp, out, 0);
    break;
  case IR_ALL_GATHER: {
    /* size 1: a copy; otherwise gather rank by rank into scratch, then place the chunks */
    fail_if(k, LLVMBuildICmp(cg->b, LLVMIntNE, mul64(cg, s, cg_i64(cg, NX)), cg_i64(cg, N), ""), fail);
    LLVMBasicBlockRef one = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "single");
    LLVMBasicBlockRef many = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "many");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(cg->ctx, k->fn, "gathered");
    LLVMBuildCondBr(cg->b, multi, many, one);
    LLVMPositionBuilderAtEnd(cg->b, one);
    cg_memcpy(cg, out, xp, cg_i64(cg, N * 4));
    LLVMBuildBr(cg->b, done);
    LLVMPositionBuilderAtEnd(cg->b, many);
    LLVMValueRef all = LLVMBuildBitCast(cg->b, k->scratch, cg->tpf32, "all");
    LLVMValueRef a[5] = {comm, cg_i32(cg, grp), xp, cg_i64(cg, NX), all};
    fail_if(k, LLVMBuildICmp(cg->b, LLVMIntNE, call_coll(k, CG_CTX_ALL_GATHER, a, 5), cg_i32(cg, 0), ""), fail);
    /* the chunks are placed along the gather's axis of its input's own shape:
     * x, the memory behind a reshape in this kernel, has another rank (a
     * [B, T, D] slice reshaped to [B, 1, T, D] and gathered along T: MLA's
     * rotary key under sequence parallelism) */
    const IrNode *shape = nd(k, n->in[0]);
    CgLoop lr;
    cg_loop_open(cg, &lr, s, 0, NULL, "rank");
    chunk_copy(k, shape, n->attr[1], (int)n->attr[2], lr.iv, s, out,
               cg_gep(cg, cg->tf32, all, mul64(cg, lr.iv, cg_i64(cg, NX)), ""), 1);
    cg_loop_close(cg, &lr, NULL, 0, NULL);
    LLVMBuildBr(cg->b, done);
    LLVMPositionBuilderAtEnd(cg->b, done);
    break;
  }
  case IR_REDUCE_SCATTER: {
    fail_if(k, LLVMBuildICmp(cg->b, LLVMIntNE, mul64(cg, s, cg_i64(cg, N)), cg_i64(cg, NX), ""), fail);
    LLVMValueRef sum = LLVMBuildBitCast(cg->b, k->scratch, cg->tpf32, "sum");
    cg_memcpy(cg, sum, xp, cg_i64(cg, NX * 4));
    LLVMBasicBlockRef done = if_begin(k, multi);
    LLVMValueRef a[5] = {comm, cg_i32(cg, grp), cg_i32(cg, 0), sum, cg_i64(cg, NX)};
    fail_if(k, LLVMBuildICmp(cg->b, LLVMIntNE, call_coll(k, CG_CTX_ALL_REDUCE, a, 5), cg_i32(cg, 0), ""), fail);
    if_end(k, done);
    chunk_copy(k, n, n->attr[1], (int)n->attr[2], r, s, sum, out, 0);
    break;
  }
  case IR_SEND:
  case IR_RECV: {
    /* a transfer between pipeline stages; alone in the group, there is no peer */
    fail_if(k, LLVMBuildNot(cg->b, multi, ""), fail);
    LLVMValueRef buf = n->op == IR_SEND ? xp : out;
    LLVMValueRef a[5] = {comm, cg_i32(cg, grp), cg_i32(cg, n->attr[1]), buf, cg_i64(cg, n->op == IR_SEND ? NX : N)};
    fail_if(k,
            LLVMBuildICmp(cg->b, LLVMIntNE, call_coll(k, n->op == IR_SEND ? CG_CTX_SEND : CG_CTX_RECV, a, 5),
                          cg_i32(cg, 0), ""),
            fail);
    if (n->op == IR_SEND && out) cg_memcpy(cg, out, xp, cg_i64(cg, N * 4));
    break;
  }
  default: cg_fail(cg, "graph %s kernel k%d: %s is not a collective", k->g->name, k->kp, ir_op_name(n->op)); break;
  }
}

/* ==== the driver's view ==== */

int cg_kernel_has_code(const FuseGraph *fg, int kp) {
  const FuseKernel *K = &fg->kernels[kp];
  switch (K->kind) {
  case FUSE_LEAF: {
    IrOp op = fg->graph->nodes[K->nodes[0]].op;
    return op == IR_FILL || op == IR_IOTA || op == IR_CONST || op == IR_LOSS_SEED || op == IR_TRAINING;
  }
  case FUSE_VIEW:
  case FUSE_CALL: return 0;
  default: return 1;
  }
}

int64_t cg_kernel_scratch(CgCpu *cg, int gi, int kp) {
  const FuseGraph *fg = &cg->fr->graphs[gi];
  const FuseKernel *K = &fg->kernels[kp];
  const IrGraph *g = fg->graph;
  if (K->kind == FUSE_ROW && K->red_hi < K->rank) {
    /* the column schedule's accumulators: 8 bytes per trailing position for
     * each reduction that cannot accumulate in its own output (a max, a
     * softmax's two, one nobody reads outside); at most 16 MiB */
    int64_t inner = 1, nslots = 0;
    for (int i = K->red_hi; i < K->rank; i++) inner *= K->dims[i];
    for (int j = 0; j < K->nnodes; j++) {
      int id = K->nodes[j];
      const IrNode *n = &g->nodes[id];
      if (!(ir_op_flags(n->op) & IRF_REDUCE)) continue;
      int out = 0;
      for (int o = 0; o < K->noutputs; o++) out |= K->outputs[o] == id;
      int direct = (n->op == IR_REDUCE_SUM || n->op == IR_REDUCE_MEAN || n->op == IR_SUM_TO) && out &&
                   n->dtype == DT_F32 && !cg->opt.acc_f64;
      nslots += n->op == IR_SOFTMAX || n->op == IR_LOG_SOFTMAX ? 2 : !direct;
    }
    int64_t b = nslots * inner * 8;
    return b <= (16 << 20) ? b : 0;
  }
  if (K->kind != FUSE_SPECIAL && K->kind != FUSE_COMM) return 0;
  int id = K->nodes[K->nnodes - 1];
  for (int j = K->nnodes - 1; j >= 0; j--)
    if (g->nodes[K->nodes[j]].op != IR_RESHAPE) {
      id = K->nodes[j];
      break;
    }
  const IrNode *n = &g->nodes[id];
  if (n->op == IR_ROPE && n->rank == 4) return 2 * n->dims[ir_rope_pos_axis(n)] * (n->dims[3] / 2) * 4;
  if (n->op == IR_CROSS_ENTROPY) return ir_numel(&g->nodes[n->in[1]]) * 8; /* the rows' losses, summed in order */
  if (n->op == IR_ALL_GATHER) return ir_numel(n) * 4;
  if (n->op == IR_REDUCE_SCATTER && n->nin) return ir_numel(&g->nodes[n->in[0]]) * 4;
  return 0;
}

LLVMValueRef cg_kernel_build(CgCpu *cg, int gi, int kp, int accumulate) {
  const FuseGraph *fg = &cg->fr->graphs[gi];
  const FuseKernel *K = &fg->kernels[kp];
  CgKern k;
  memset(&k, 0, sizeof k);
  k.cg = cg;
  k.gi = gi;
  k.kp = kp;
  k.g = fg->graph;
  k.fg = fg;
  k.K = K;
  k.nk = (NestKernel){.g = k.g, .fg = fg, .K = K, .kp = kp, .backend = "CPU", .dtype_ok = cg_dtype_ok, .fail = nest_fail_cb, .be = &k};
  k.accumulate = accumulate;
  int nio = K->ninputs + K->noutputs;
  for (int i = 0; i < nio; i++) {
    int v = i < K->ninputs ? K->inputs[i] : K->outputs[i - K->ninputs];
    DType dt = k.g->nodes[v].dtype;
    if (!cg_dtype_ok(dt)) {
      cg_fail(cg, "graph %s kernel k%d: %%%d has dtype %s, which the CPU back end does not support yet", k.g->name, kp,
              v, sem_dtype_name(dt));
      return NULL;
    }
  }
  LLVMTypeRef *pt = xalloc_calloc((size_t)nio + 3, sizeof(LLVMTypeRef));
  pt[0] = cg->tpctx;
  pt[1] = cg->tp8;
  pt[2] = cg->ti64;
  for (int i = 0; i < nio; i++) pt[3 + i] = cg->tp8;
  char name[192];
  snprintf(name, sizeof name, "%s.k%d.%s%s", k.g->name, kp, cg_kernel_family(k.g, K), accumulate ? ".acc" : "");
  k.fn = cg_add_function(cg, name, cg->ti32, pt, nio + 3, 1);
  free(pt);
  cg_fn_attr(cg, k.fn, "noinline");
  for (int i = 0; i < nio; i++) cg_param_attr(cg, k.fn, (unsigned)(3 + i), "noalias");
  k.ctxp = LLVMGetParam(k.fn, 0);
  k.scratch = LLVMGetParam(k.fn, 1);
  k.layer = LLVMGetParam(k.fn, 2);
  k.io = xalloc_calloc((size_t)nio + 1, sizeof(LLVMValueRef));
  k.inplace_of = cg->graphs[gi].inplace_of;
  for (int i = 0; i < nio; i++) k.io[i] = LLVMGetParam(k.fn, (unsigned)(3 + i));
  LLVMPositionBuilderAtEnd(cg->b, LLVMAppendBasicBlockInContext(cg->ctx, k.fn, "entry"));
  switch (K->kind) {
  case FUSE_LOOP:
  case FUSE_ROW:
  case FUSE_COPY: kernel_nest(&k); break;
  case FUSE_GEMM: kernel_gemm(&k); break;
  case FUSE_SPECIAL: kernel_special(&k); break;
  case FUSE_COMM: kernel_comm(&k); break;
  case FUSE_LEAF:
    if (k.g->nodes[K->nodes[0]].op == IR_LOSS_SEED || k.g->nodes[K->nodes[0]].op == IR_TRAINING)
      special_host(&k, &k.g->nodes[K->nodes[0]], K->nodes[0]);
    else kernel_nest(&k);
    break;
  default: cg_fail(cg, "graph %s kernel k%d: a %s unit has no code", k.g->name, kp, fuse_kind_name(K->kind)); break;
  }
  LLVMBuildRet(cg->b, cg_i32(cg, 0));
  free(k.io);
  return k.fn;
}
