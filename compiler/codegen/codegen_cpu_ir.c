/* codegen_cpu_ir.c - LLVM IR helpers of the CPU back end: constants, calls,
 * the hpd_ctx fields, counted loops, and fp32 math written out as
 * arithmetic so that the loop vectoriser can vectorise loops that use it.
 *
 * exp, log and tanh are Cephes' single-precision algorithms (S. L. Moshier,
 * Cephes Math Library, expf.c / logf.c / tanhf.c): range reduction, then a
 * minimax polynomial; relative error about 1-2 ulp of fp32 over the ranges
 * the kernels use, well inside the 1e-5 the back end is tested to. Each is
 * an internal always-inline function, so after inlining a loop over a
 * softmax row is plain vector arithmetic (no calls into libm). */
#include <llvm-c/DebugInfo.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_cpu_int.h"

void cg_fail(CgCpu *cg, const char *fmt, ...) {
  if (cg->failed) return; /* keep the first: later ones follow from it */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cg->err, sizeof cg->err, fmt, ap);
  va_end(ap);
  cg->failed = 1;
}

void cg_llvm_fail(CgCpu *cg, const char *file, int line, const char *call, char *msg) {
  cg_fail(cg, "%s:%d: %s: %s", file, line, call, msg && *msg ? msg : "(LLVM gave no message)");
  if (msg) LLVMDisposeMessage(msg);
}

LLVMValueRef cg_i64(CgCpu *cg, int64_t v) { return LLVMConstInt(cg->ti64, (unsigned long long)v, 1); }
LLVMValueRef cg_i32(CgCpu *cg, int64_t v) { return LLVMConstInt(cg->ti32, (unsigned long long)v, 1); }
LLVMValueRef cg_f32(CgCpu *cg, double v) { return LLVMConstReal(cg->tf32, v); }
LLVMValueRef cg_f64(CgCpu *cg, double v) { return LLVMConstReal(cg->tf64, v); }

LLVMValueRef cg_add_function(CgCpu *cg, const char *name, LLVMTypeRef ret, LLVMTypeRef *params, int n, int internal) {
  LLVMValueRef fn = LLVMAddFunction(cg->mod, name, LLVMFunctionType(ret, params, (unsigned)n, 0));
  if (internal) LLVMSetLinkage(fn, LLVMInternalLinkage);
  cg_fn_attr(cg, fn, "nounwind");
  return fn;
}

static LLVMAttributeRef enum_attr(CgCpu *cg, const char *attr) {
  unsigned kind = LLVMGetEnumAttributeKindForName(attr, strlen(attr));
  return LLVMCreateEnumAttribute(cg->ctx, kind, 0);
}

void cg_fn_attr(CgCpu *cg, LLVMValueRef fn, const char *attr) {
  LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, enum_attr(cg, attr));
}

void cg_fn_str_attr(CgCpu *cg, LLVMValueRef fn, const char *key, const char *value) {
  LLVMAddAttributeAtIndex(
      fn, LLVMAttributeFunctionIndex,
      LLVMCreateStringAttribute(cg->ctx, key, (unsigned)strlen(key), value, (unsigned)strlen(value)));
}

void cg_param_attr(CgCpu *cg, LLVMValueRef fn, unsigned index, const char *attr) {
  LLVMAddAttributeAtIndex(fn, index + 1, enum_attr(cg, attr));
}

LLVMValueRef cg_call(CgCpu *cg, LLVMValueRef fn, LLVMValueRef *args, int n, const char *name) {
  return LLVMBuildCall2(cg->b, LLVMGlobalGetValueType(fn), fn, args, (unsigned)n, name);
}

LLVMValueRef cg_gep(CgCpu *cg, LLVMTypeRef elem, LLVMValueRef ptr, LLVMValueRef idx, const char *name) {
  return LLVMBuildInBoundsGEP2(cg->b, elem, ptr, &idx, 1, name);
}

LLVMValueRef cg_byte_ptr(CgCpu *cg, LLVMValueRef base, LLVMValueRef offset_bytes, const char *name) {
  return cg_gep(cg, cg->ti8, base, offset_bytes, name);
}

LLVMTypeRef cg_extern_hook_type(CgCpu *cg) {
  LLVMTypeRef p[4] = {cg->tpctx, cg->ti32, cg->ti32, cg->tpp8};
  return LLVMFunctionType(cg->ti32, p, 4, 0);
}

static LLVMTypeRef ctx_field_type(CgCpu *cg, int field) { return LLVMStructGetTypeAtIndex(cg->tctx, (unsigned)field); }

LLVMValueRef cg_parallel(CgCpu *cg, LLVMValueRef ctxp, LLVMValueRef range, LLVMValueRef env8, LLVMValueRef nunits,
                         LLVMValueRef work) {
  LLVMValueRef hook = cg_ctx_field(cg, ctxp, CG_CTX_PARALLEL, "parallel");
  LLVMValueRef fn = LLVMGetBasicBlockParent(LLVMGetInsertBlock(cg->b));
  LLVMBasicBlockRef inline_bb = LLVMAppendBasicBlockInContext(cg->ctx, fn, "par.inline");
  LLVMBasicBlockRef hook_bb = LLVMAppendBasicBlockInContext(cg->ctx, fn, "par.hook");
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(cg->ctx, fn, "par.done");
  LLVMBuildCondBr(cg->b, LLVMBuildIsNull(cg->b, hook, ""), inline_bb, hook_bb);
  LLVMPositionBuilderAtEnd(cg->b, inline_bb);
  LLVMValueRef ra[3] = {env8, cg_i64(cg, 0), nunits};
  LLVMValueRef rc0 = LLVMBuildCall2(cg->b, cg->trange, range, ra, 3, "rc");
  LLVMBuildBr(cg->b, done);
  LLVMPositionBuilderAtEnd(cg->b, hook_bb);
  LLVMValueRef ha[5] = {ctxp, nunits, work, range, env8};
  LLVMValueRef rc1 = LLVMBuildCall2(cg->b, cg->tparallel, hook, ha, 5, "rc");
  LLVMBuildBr(cg->b, done);
  LLVMPositionBuilderAtEnd(cg->b, done);
  LLVMValueRef rc = LLVMBuildPhi(cg->b, cg->ti32, "rc");
  LLVMValueRef v[2] = {rc0, rc1};
  LLVMBasicBlockRef bb[2] = {inline_bb, hook_bb};
  LLVMAddIncoming(rc, v, bb, 2);
  return rc;
}

LLVMValueRef cg_ctx_field(CgCpu *cg, LLVMValueRef ctxp, int field, const char *name) {
  LLVMValueRef p = LLVMBuildStructGEP2(cg->b, cg->tctx, ctxp, (unsigned)field, "");
  return LLVMBuildLoad2(cg->b, ctx_field_type(cg, field), p, name);
}

LLVMValueRef cg_ctx_group(CgCpu *cg, LLVMValueRef ctxp, int field, int group) {
  LLVMValueRef p = LLVMBuildStructGEP2(cg->b, cg->tctx, ctxp, (unsigned)field, "");
  LLVMValueRef idx[2] = {cg_i32(cg, 0), cg_i32(cg, group)};
  LLVMValueRef q = LLVMBuildInBoundsGEP2(cg->b, ctx_field_type(cg, field), p, idx, 2, "");
  LLVMValueRef v = LLVMBuildLoad2(cg->b, cg->ti32, q, field == CG_CTX_RANK ? "rank" : "size");
  return LLVMBuildSExt(cg->b, v, cg->ti64, "");
}

static LLVMValueRef intrinsic(CgCpu *cg, const char *name, LLVMTypeRef *types, int ntypes) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  if (!id) {
    cg_fail(cg, "LLVM has no intrinsic %s", name);
    return NULL;
  }
  return LLVMGetIntrinsicDeclaration(cg->mod, id, types, (size_t)ntypes);
}

void cg_memcpy(CgCpu *cg, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef bytes) {
  if (!cg->fn_memcpy) {
    LLVMTypeRef t[3] = {cg->tp8, cg->tp8, cg->ti64};
    cg->fn_memcpy = intrinsic(cg, "llvm.memcpy", t, 3);
  }
  if (!cg->fn_memcpy) return;
  LLVMValueRef a[4] = {LLVMBuildBitCast(cg->b, dst, cg->tp8, ""), LLVMBuildBitCast(cg->b, src, cg->tp8, ""), bytes,
                       LLVMConstInt(cg->ti1, 0, 0)};
  cg_call(cg, cg->fn_memcpy, a, 4, "");
}

void cg_memmove(CgCpu *cg, LLVMValueRef dst, LLVMValueRef src, LLVMValueRef bytes) {
  if (!cg->fn_memmove) {
    LLVMTypeRef t[3] = {cg->tp8, cg->tp8, cg->ti64};
    cg->fn_memmove = intrinsic(cg, "llvm.memmove", t, 3);
  }
  if (!cg->fn_memmove) return;
  LLVMValueRef a[4] = {LLVMBuildBitCast(cg->b, dst, cg->tp8, ""), LLVMBuildBitCast(cg->b, src, cg->tp8, ""), bytes,
                       LLVMConstInt(cg->ti1, 0, 0)};
  cg_call(cg, cg->fn_memmove, a, 4, "");
}

void cg_memset0(CgCpu *cg, LLVMValueRef dst, LLVMValueRef bytes) {
  if (!cg->fn_memset) {
    LLVMTypeRef t[2] = {cg->tp8, cg->ti64};
    cg->fn_memset = intrinsic(cg, "llvm.memset", t, 2);
  }
  if (!cg->fn_memset) return;
  LLVMValueRef a[4] = {LLVMBuildBitCast(cg->b, dst, cg->tp8, ""), LLVMConstInt(cg->ti8, 0, 0), bytes,
                       LLVMConstInt(cg->ti1, 0, 0)};
  cg_call(cg, cg->fn_memset, a, 4, "");
}

LLVMValueRef cg_global_string(CgCpu *cg, const char *s, const char *name) {
  return LLVMBuildGlobalStringPtr(cg->b, s, name);
}

/* ---- loops ---- */

void cg_loop_open(CgCpu *cg, CgLoop *l, LLVMValueRef n, int ncarry, const LLVMValueRef *init, const char *name) {
  memset(l, 0, sizeof *l);
  l->n = n;
  l->ncarry = ncarry;
  LLVMBasicBlockRef cur = LLVMGetInsertBlock(cg->b);
  LLVMValueRef fn = LLVMGetBasicBlockParent(cur);
  l->pre = cur;
  l->head = LLVMAppendBasicBlockInContext(cg->ctx, fn, name);
  l->guarded = !(LLVMIsAConstantInt(n) && LLVMConstIntGetSExtValue(n) > 0);
  if (l->guarded) {
    l->guard_exit = LLVMAppendBasicBlockInContext(cg->ctx, fn, "after");
    LLVMValueRef c = LLVMBuildICmp(cg->b, LLVMIntSGT, n, cg_i64(cg, 0), "");
    LLVMBuildCondBr(cg->b, c, l->head, l->guard_exit);
  } else {
    LLVMBuildBr(cg->b, l->head);
  }
  LLVMPositionBuilderAtEnd(cg->b, l->head);
  l->iv = LLVMBuildPhi(cg->b, cg->ti64, "i");
  for (int k = 0; k < ncarry; k++) {
    l->init[k] = init[k];
    l->phi[k] = LLVMBuildPhi(cg->b, LLVMTypeOf(init[k]), "acc");
  }
}

/* A distinct, self-referencing loop id: !{!self, !{"llvm.loop.vectorize.enable", i1 true}}.
 * The C API has no MDNode::getDistinct; replacing a temporary operand with
 * the node itself makes LLVM store it as distinct (MDNode's self-reference rule). */
static LLVMValueRef vectorize_md(CgCpu *cg) {
  LLVMMetadataRef tmp = LLVMTemporaryMDNode(cg->ctx, NULL, 0);
  LLVMMetadataRef hint_ops[2] = {LLVMMDStringInContext2(cg->ctx, "llvm.loop.vectorize.enable", 26),
                                 LLVMValueAsMetadata(LLVMConstInt(cg->ti1, 1, 0))};
  LLVMMetadataRef ops[2] = {tmp, LLVMMDNodeInContext2(cg->ctx, hint_ops, 2)};
  LLVMMetadataRef id = LLVMMDNodeInContext2(cg->ctx, ops, 2);
  LLVMMetadataReplaceAllUsesWith(tmp, id);
  return LLVMMetadataAsValue(cg->ctx, id);
}

void cg_loop_close(CgCpu *cg, CgLoop *l, const LLVMValueRef *next, int vec, LLVMValueRef *out) {
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(cg->b);
  LLVMValueRef fn = LLVMGetBasicBlockParent(latch);
  LLVMValueRef inext = LLVMBuildAdd(cg->b, l->iv, cg_i64(cg, 1), "i.next");
  LLVMValueRef c = LLVMBuildICmp(cg->b, LLVMIntSLT, inext, l->n, "");
  LLVMBasicBlockRef exit = l->guarded ? l->guard_exit : LLVMAppendBasicBlockInContext(cg->ctx, fn, "exit");
  LLVMValueRef br = LLVMBuildCondBr(cg->b, c, l->head, exit);
  if (vec) LLVMSetMetadata(br, cg->md_loop, vectorize_md(cg));
  LLVMValueRef v0[2] = {cg_i64(cg, 0), inext};
  LLVMBasicBlockRef bb[2] = {l->pre, latch};
  LLVMAddIncoming(l->iv, v0, bb, 2);
  for (int k = 0; k < l->ncarry; k++) {
    LLVMValueRef v[2] = {l->init[k], next[k]};
    LLVMAddIncoming(l->phi[k], v, bb, 2);
  }
  LLVMPositionBuilderAtEnd(cg->b, exit);
  for (int k = 0; k < l->ncarry; k++) {
    if (!out) break;
    if (l->guarded) {
      LLVMValueRef p = LLVMBuildPhi(cg->b, LLVMTypeOf(l->init[k]), "");
      LLVMValueRef v[2] = {l->init[k], next[k]};
      LLVMAddIncoming(p, v, bb, 2);
      out[k] = p;
    } else {
      out[k] = next[k];
    }
  }
}

/* ---- math ---- */

static LLVMValueRef fmul(CgCpu *cg, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFMul(cg->b, a, b, ""); }
static LLVMValueRef fadd(CgCpu *cg, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFAdd(cg->b, a, b, ""); }
static LLVMValueRef fsub(CgCpu *cg, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFSub(cg->b, a, b, ""); }
static LLVMValueRef fdiv(CgCpu *cg, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFDiv(cg->b, a, b, ""); }
static LLVMValueRef kf(CgCpu *cg, double v) { return cg_f32(cg, v); }

static LLVMValueRef sel(CgCpu *cg, LLVMRealPredicate p, LLVMValueRef a, LLVMValueRef b, LLVMValueRef t,
                        LLVMValueRef f) {
  return LLVMBuildSelect(cg->b, LLVMBuildFCmp(cg->b, p, a, b, ""), t, f, "");
}

LLVMValueRef cg_select_gt(CgCpu *cg, LLVMValueRef a, LLVMValueRef b, LLVMValueRef t, LLVMValueRef f) {
  return sel(cg, LLVMRealOGT, a, b, t, f);
}

static LLVMValueRef unary_intrinsic(CgCpu *cg, LLVMValueRef *cache, const char *name, LLVMValueRef x) {
  if (!*cache) *cache = intrinsic(cg, name, &cg->tf32, 1);
  if (!*cache) return x;
  return cg_call(cg, *cache, &x, 1, "");
}

LLVMValueRef cg_sqrt(CgCpu *cg, LLVMValueRef x) { return unary_intrinsic(cg, &cg->fn_sqrt, "llvm.sqrt", x); }
LLVMValueRef cg_fabs(CgCpu *cg, LLVMValueRef x) { return unary_intrinsic(cg, &cg->fn_fabs, "llvm.fabs", x); }
LLVMValueRef cg_trunc(CgCpu *cg, LLVMValueRef x) { return unary_intrinsic(cg, &cg->fn_trunc, "llvm.trunc", x); }
static LLVMValueRef ffloor(CgCpu *cg, LLVMValueRef x) { return unary_intrinsic(cg, &cg->fn_floor, "llvm.floor", x); }

/* Starts an internal always-inline f32 -> f32 helper; returns its argument
 * and leaves the builder in its entry block (the caller's position is saved
 * in *saved). */
static LLVMValueRef helper_begin(CgCpu *cg, LLVMValueRef *fn, const char *name, LLVMBasicBlockRef *saved) {
  *saved = LLVMGetInsertBlock(cg->b);
  LLVMTypeRef p = cg->tf32;
  *fn = cg_add_function(cg, name, cg->tf32, &p, 1, 1);
  cg_fn_attr(cg, *fn, "alwaysinline");
  cg_fn_attr(cg, *fn, "readnone");
  LLVMPositionBuilderAtEnd(cg->b, LLVMAppendBasicBlockInContext(cg->ctx, *fn, "entry"));
  return LLVMGetParam(*fn, 0);
}

static void helper_end(CgCpu *cg, LLVMValueRef v, LLVMBasicBlockRef saved) {
  LLVMBuildRet(cg->b, v);
  if (saved) LLVMPositionBuilderAtEnd(cg->b, saved);
}

static LLVMValueRef is_nan(CgCpu *cg, LLVMValueRef x) { return LLVMBuildFCmp(cg->b, LLVMRealUNO, x, x, ""); }

/* Cephes expf: x = n ln2 + r, |r| <= ln2 / 2; e^r by a degree-6
 * polynomial; 2^n by building the float's exponent field. Arguments below
 * -87 (results under 1.7e-38) give 0: clamping there keeps every
 * intermediate a normal float - a subnormal product costs a microcode
 * assist of ~100 cycles per element on x86, and a causal mask's -inf row
 * half would hit it in every softmax. Above FLT_MAX the result is +inf. */
static void build_exp(CgCpu *cg) {
  LLVMBasicBlockRef saved;
  LLVMValueRef x = helper_begin(cg, &cg->fn_exp, "hpd.expf", &saved);
  const double hi = 88.3762626647949, lo = -87.0;
  LLVMValueRef xc = sel(cg, LLVMRealOGT, x, kf(cg, hi), kf(cg, hi), x);
  xc = sel(cg, LLVMRealOLT, xc, kf(cg, lo), kf(cg, lo), xc);
  LLVMValueRef fx = ffloor(cg, fadd(cg, fmul(cg, xc, kf(cg, 1.44269504088896341)), kf(cg, 0.5)));
  LLVMValueRef r = fsub(cg, xc, fmul(cg, fx, kf(cg, 0.693359375)));
  r = fsub(cg, r, fmul(cg, fx, kf(cg, -2.12194440e-4)));
  LLVMValueRef z = fmul(cg, r, r);
  LLVMValueRef y = kf(cg, 1.9875691500E-4);
  static const double c[] = {1.3981999507E-3, 8.3334519073E-3, 4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1};
  for (int i = 0; i < 5; i++) y = fadd(cg, fmul(cg, y, r), kf(cg, c[i]));
  y = fadd(cg, fadd(cg, fmul(cg, y, z), r), kf(cg, 1.0));
  LLVMValueRef n = LLVMBuildFPToSI(cg->b, fx, cg->ti32, "");
  LLVMValueRef e = LLVMBuildShl(cg->b, LLVMBuildAdd(cg->b, n, cg_i32(cg, 127), ""), cg_i32(cg, 23), "");
  LLVMValueRef res = fmul(cg, y, LLVMBuildBitCast(cg->b, e, cg->tf32, ""));
  res = sel(cg, LLVMRealOGT, x, kf(cg, 88.72283935546875), kf(cg, INFINITY), res);
  res = sel(cg, LLVMRealOLT, x, kf(cg, lo), kf(cg, 0.0), res);
  res = LLVMBuildSelect(cg->b, is_nan(cg, x), x, res, "");
  helper_end(cg, res, saved);
}

/* Cephes logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)); log(m) by a
 * degree-9 polynomial in m - 1; subnormal x scaled by 2^23 first. */
static void build_log(CgCpu *cg) {
  LLVMBasicBlockRef saved;
  LLVMValueRef x = helper_begin(cg, &cg->fn_log, "hpd.logf", &saved);
  LLVMValueRef small = LLVMBuildFCmp(cg->b, LLVMRealOLT, x, kf(cg, 1.17549435e-38), "");
  LLVMValueRef xs = LLVMBuildSelect(cg->b, small, fmul(cg, x, kf(cg, 8388608.0)), x, "");
  LLVMValueRef bits = LLVMBuildBitCast(cg->b, xs, cg->ti32, "");
  LLVMValueRef ei =
      LLVMBuildSub(cg->b, LLVMBuildAnd(cg->b, LLVMBuildLShr(cg->b, bits, cg_i32(cg, 23), ""), cg_i32(cg, 0xff), ""),
                   cg_i32(cg, 126), "");
  LLVMValueRef mb =
      LLVMBuildOr(cg->b, LLVMBuildAnd(cg->b, bits, cg_i32(cg, (int32_t)0x807fffff), ""), cg_i32(cg, 0x3f000000), "");
  LLVMValueRef m = LLVMBuildBitCast(cg->b, mb, cg->tf32, "");
  LLVMValueRef e = LLVMBuildSIToFP(cg->b, ei, cg->tf32, "");
  LLVMValueRef lt = LLVMBuildFCmp(cg->b, LLVMRealOLT, m, kf(cg, 0.707106781186547524), "");
  e = LLVMBuildSelect(cg->b, lt, fsub(cg, e, kf(cg, 1.0)), e, "");
  m = LLVMBuildSelect(cg->b, lt, fsub(cg, fadd(cg, m, m), kf(cg, 1.0)), fsub(cg, m, kf(cg, 1.0)), "");
  LLVMValueRef z = fmul(cg, m, m);
  static const double c[] = {-1.1514610310E-1, 1.1676998740E-1, -1.2420140846E-1, 1.4249322787E-1,
                             -1.6668057665E-1, 2.0000714765E-1, -2.4999993993E-1, 3.3333331174E-1};
  LLVMValueRef y = kf(cg, 7.0376836292E-2);
  for (int i = 0; i < 8; i++) y = fadd(cg, fmul(cg, y, m), kf(cg, c[i]));
  y = fmul(cg, fmul(cg, y, m), z);
  y = fadd(cg, y, fmul(cg, e, kf(cg, -2.12194440e-4)));
  y = fadd(cg, y, fmul(cg, z, kf(cg, -0.5)));
  LLVMValueRef res = fadd(cg, fadd(cg, m, y), fmul(cg, e, kf(cg, 0.693359375)));
  res = LLVMBuildSelect(cg->b, small, fsub(cg, res, kf(cg, 15.942385152878742)), res, "");
  res = sel(cg, LLVMRealOEQ, x, kf(cg, INFINITY), x, res);
  res = sel(cg, LLVMRealOEQ, x, kf(cg, 0.0), kf(cg, -INFINITY), res);
  res = sel(cg, LLVMRealOLT, x, kf(cg, 0.0), kf(cg, NAN), res);
  res = LLVMBuildSelect(cg->b, is_nan(cg, x), x, res, "");
  helper_end(cg, res, saved);
}

/* Cephes tanhf: an odd polynomial for |x| < 0.625, 1 - 2 / (e^2|x| + 1)
 * with the sign restored above. */
static void build_tanh(CgCpu *cg) {
  if (!cg->fn_exp) build_exp(cg);
  LLVMBasicBlockRef saved;
  LLVMValueRef x = helper_begin(cg, &cg->fn_tanh, "hpd.tanhf", &saved);
  LLVMValueRef ax = cg_fabs(cg, x);
  LLVMValueRef z = fmul(cg, x, x);
  LLVMValueRef p = kf(cg, -5.70498872745E-3);
  static const double c[] = {2.06390887954E-2, -5.37397155531E-2, 1.33314422036E-1, -3.33332819422E-1};
  for (int i = 0; i < 4; i++) p = fadd(cg, fmul(cg, p, z), kf(cg, c[i]));
  p = fadd(cg, fmul(cg, fmul(cg, p, z), x), x);
  LLVMValueRef arg = fmul(cg, ax, kf(cg, 2.0));
  LLVMValueRef e = cg_call(cg, cg->fn_exp, &arg, 1, "");
  LLVMValueRef t = fsub(cg, kf(cg, 1.0), fdiv(cg, kf(cg, 2.0), fadd(cg, e, kf(cg, 1.0))));
  t = sel(cg, LLVMRealOLT, x, kf(cg, 0.0), LLVMBuildFNeg(cg->b, t, ""), t);
  LLVMValueRef res = sel(cg, LLVMRealOLT, ax, kf(cg, 0.625), p, t);
  res = LLVMBuildSelect(cg->b, is_nan(cg, x), x, res, "");
  helper_end(cg, res, saved);
}

LLVMValueRef cg_exp(CgCpu *cg, LLVMValueRef x) {
  if (!cg->fn_exp) build_exp(cg);
  return cg_call(cg, cg->fn_exp, &x, 1, "");
}

LLVMValueRef cg_log(CgCpu *cg, LLVMValueRef x) {
  if (!cg->fn_log) build_log(cg);
  return cg_call(cg, cg->fn_log, &x, 1, "");
}

LLVMValueRef cg_tanh(CgCpu *cg, LLVMValueRef x) {
  if (!cg->fn_tanh) build_tanh(cg);
  return cg_call(cg, cg->fn_tanh, &x, 1, "");
}

LLVMValueRef cg_sigmoid(CgCpu *cg, LLVMValueRef x) {
  return fdiv(cg, kf(cg, 1.0), fadd(cg, kf(cg, 1.0), cg_exp(cg, LLVMBuildFNeg(cg->b, x, ""))));
}

static LLVMValueRef libm64(CgCpu *cg, LLVMValueRef *cache, const char *name, LLVMValueRef *args, int n) {
  if (!*cache) {
    LLVMTypeRef p[2] = {cg->tf64, cg->tf64};
    *cache = cg_add_function(cg, name, cg->tf64, p, n, 0);
  }
  return cg_call(cg, *cache, args, n, "");
}

LLVMValueRef cg_pow64(CgCpu *cg, LLVMValueRef x, LLVMValueRef y) {
  LLVMValueRef a[2] = {x, y};
  return libm64(cg, &cg->fn_pow64, "pow", a, 2);
}
LLVMValueRef cg_cos64(CgCpu *cg, LLVMValueRef x) { return libm64(cg, &cg->fn_cos64, "cos", &x, 1); }
LLVMValueRef cg_sin64(CgCpu *cg, LLVMValueRef x) { return libm64(cg, &cg->fn_sin64, "sin", &x, 1); }

static const double GELU_K = 0.79788456080286535588; /* sqrt(2 / pi), as interp.c */
static const double GELU_C = 0.044715;

/* x^p: exact products for small integer exponents (interp uses pow(),
 * which is exact there too, and defined for negative x), sqrt for +-1/2,
 * exp(p log x) otherwise (NaN for negative x, as pow). */
static LLVMValueRef powf_const(CgCpu *cg, LLVMValueRef x, double p) {
  if (p == 0) return kf(cg, 1.0);
  if (p == 0.5) return cg_sqrt(cg, x);
  if (p == -0.5) return fdiv(cg, kf(cg, 1.0), cg_sqrt(cg, x));
  if (p == floor(p) && fabs(p) <= 16) {
    int k = (int)fabs(p);
    LLVMValueRef r = NULL, base = x;
    while (k) { /* square and multiply */
      if (k & 1) r = r ? fmul(cg, r, base) : base;
      k >>= 1;
      if (k) base = fmul(cg, base, base);
    }
    return p < 0 ? fdiv(cg, kf(cg, 1.0), r) : r;
  }
  return cg_exp(cg, fmul(cg, kf(cg, p), cg_log(cg, x)));
}

LLVMValueRef cg_unary(CgCpu *cg, IrOp op, double p, LLVMValueRef x) {
  switch (op) {
  case IR_NEG: return LLVMBuildFNeg(cg->b, x, "");
  case IR_RELU: return sel(cg, LLVMRealOGT, x, kf(cg, 0.0), x, kf(cg, 0.0));
  case IR_GELU: {
    LLVMValueRef u = fmul(cg, kf(cg, GELU_K), fadd(cg, x, fmul(cg, kf(cg, GELU_C), fmul(cg, x, fmul(cg, x, x)))));
    return fmul(cg, fmul(cg, kf(cg, 0.5), x), fadd(cg, kf(cg, 1.0), cg_tanh(cg, u)));
  }
  case IR_SILU: return fmul(cg, x, cg_sigmoid(cg, x));
  case IR_SIGMOID: return cg_sigmoid(cg, x);
  case IR_TANH: return cg_tanh(cg, x);
  case IR_EXP: return cg_exp(cg, x);
  case IR_LOG: return cg_log(cg, x);
  case IR_SQRT: return cg_sqrt(cg, x);
  case IR_RSQRT: return fdiv(cg, kf(cg, 1.0), cg_sqrt(cg, x));
  case IR_ABS: return cg_fabs(cg, x);
  case IR_SQUARE: return fmul(cg, x, x);
  case IR_POWS: return powf_const(cg, x, p);
  case IR_CAST: return x;
  default: cg_fail(cg, "no fp32 rule for unary op %s", ir_op_name(op)); return x;
  }
}

LLVMValueRef cg_unary_deriv(CgCpu *cg, IrOp op, double p, LLVMValueRef x) {
  switch (op) {
  case IR_NEG: return kf(cg, -1.0);
  case IR_CAST: return kf(cg, 1.0);
  case IR_RELU: return sel(cg, LLVMRealOGT, x, kf(cg, 0.0), kf(cg, 1.0), kf(cg, 0.0));
  case IR_GELU: {
    LLVMValueRef x2 = fmul(cg, x, x);
    LLVMValueRef u = fmul(cg, kf(cg, GELU_K), fadd(cg, x, fmul(cg, kf(cg, GELU_C), fmul(cg, x, x2))));
    LLVMValueRef t = cg_tanh(cg, u);
    LLVMValueRef a = fmul(cg, kf(cg, 0.5), fadd(cg, kf(cg, 1.0), t));
    LLVMValueRef b = fmul(cg, fmul(cg, kf(cg, 0.5), x), fsub(cg, kf(cg, 1.0), fmul(cg, t, t)));
    LLVMValueRef c = fmul(cg, kf(cg, GELU_K), fadd(cg, kf(cg, 1.0), fmul(cg, kf(cg, 3.0 * GELU_C), x2)));
    return fadd(cg, a, fmul(cg, b, c));
  }
  case IR_SILU: {
    LLVMValueRef s = cg_sigmoid(cg, x);
    return fadd(cg, s, fmul(cg, fmul(cg, x, s), fsub(cg, kf(cg, 1.0), s)));
  }
  case IR_SIGMOID: {
    LLVMValueRef s = cg_sigmoid(cg, x);
    return fmul(cg, s, fsub(cg, kf(cg, 1.0), s));
  }
  case IR_TANH: {
    LLVMValueRef t = cg_tanh(cg, x);
    return fsub(cg, kf(cg, 1.0), fmul(cg, t, t));
  }
  case IR_EXP: return cg_exp(cg, x);
  case IR_LOG: return fdiv(cg, kf(cg, 1.0), x);
  case IR_SQRT: return fdiv(cg, kf(cg, 0.5), cg_sqrt(cg, x));
  case IR_RSQRT: return fdiv(cg, kf(cg, -0.5), fmul(cg, x, cg_sqrt(cg, x)));
  case IR_ABS:
    return sel(cg, LLVMRealOGT, x, kf(cg, 0.0), kf(cg, 1.0),
               sel(cg, LLVMRealOLT, x, kf(cg, 0.0), kf(cg, -1.0), kf(cg, 0.0)));
  case IR_SQUARE: return fmul(cg, kf(cg, 2.0), x);
  case IR_POWS: return fmul(cg, kf(cg, p), powf_const(cg, x, p - 1.0));
  default: cg_fail(cg, "act_grad of %s has no derivative rule", ir_op_name(op)); return x;
  }
}

LLVMValueRef cg_binary(CgCpu *cg, IrOp op, LLVMValueRef a, LLVMValueRef b) {
  switch (op) {
  case IR_ADD: return fadd(cg, a, b);
  case IR_SUB: return fsub(cg, a, b);
  case IR_MUL: return fmul(cg, a, b);
  case IR_DIV: return fdiv(cg, a, b);
  case IR_MAXIMUM: return sel(cg, LLVMRealOGT, a, b, a, b);
  case IR_MINIMUM: return sel(cg, LLVMRealOLT, a, b, a, b);
  default: cg_fail(cg, "no rule for binary op %s", ir_op_name(op)); return a;
  }
}

/* ---- element types ---- */

int cg_dtype_ok(DType t) {
  return t == DT_F32 || t == DT_F64 || t == DT_BF16 || t == DT_F16 || t == DT_I32 || t == DT_I64 || t == DT_BOOL;
}

LLVMTypeRef cg_elem_type(CgCpu *cg, DType t) {
  switch (t) {
  case DT_F64: return cg->tf64;
  case DT_BF16:
  case DT_F16: return cg->ti16; /* 16-bit storage, converted by integer arithmetic (half.c's) */
  case DT_I32: return cg->ti32;
  case DT_I64: return cg->ti64;
  case DT_BOOL: return cg->ti8;
  default: return cg->tf32;
  }
}

int64_t cg_elem_bytes(DType t) { return sem_dtype_bytes(t); }

/* ---- 16-bit floats: the same bits as core/numeric/half.c (round to
 * nearest even), in integer arithmetic that needs no F16C or AVX512-BF16
 * and vectorises (selects, no branches) ---- */

static LLVMValueRef u32c(CgCpu *cg, uint32_t x) { return LLVMConstInt(cg->ti32, x, 0); }

static LLVMValueRef bits_f32(CgCpu *cg, LLVMValueRef f) { return LLVMBuildBitCast(cg->b, f, cg->ti32, ""); }
static LLVMValueRef f32_bits(CgCpu *cg, LLVMValueRef u) { return LLVMBuildBitCast(cg->b, u, cg->tf32, ""); }

static LLVMValueRef bf16_to_f32(CgCpu *cg, LLVMValueRef h) {
  return f32_bits(cg, LLVMBuildShl(cg->b, LLVMBuildZExt(cg->b, h, cg->ti32, ""), u32c(cg, 16), ""));
}

static LLVMValueRef bf16_from_f32(CgCpu *cg, LLVMValueRef f) {
  LLVMBuilderRef b = cg->b;
  LLVMValueRef u = bits_f32(cg, f);
  LLVMValueRef odd = LLVMBuildAnd(b, LLVMBuildLShr(b, u, u32c(cg, 16), ""), u32c(cg, 1), "");
  LLVMValueRef r = LLVMBuildLShr(b, LLVMBuildAdd(b, LLVMBuildAdd(b, u, u32c(cg, 0x7fff), ""), odd, ""), u32c(cg, 16), "");
  /* a NaN stays a quiet NaN (rounding could carry it into infinity) */
  LLVMValueRef nan = LLVMBuildICmp(b, LLVMIntUGT, LLVMBuildAnd(b, u, u32c(cg, 0x7fffffff), ""), u32c(cg, 0x7f800000), "");
  LLVMValueRef q = LLVMBuildOr(b, LLVMBuildLShr(b, u, u32c(cg, 16), ""), u32c(cg, 0x40), "");
  return LLVMBuildTrunc(b, LLVMBuildSelect(b, nan, q, r, ""), cg->ti16, "");
}

static LLVMValueRef f16_to_f32(CgCpu *cg, LLVMValueRef h) {
  LLVMBuilderRef b = cg->b;
  LLVMValueRef x = LLVMBuildZExt(b, h, cg->ti32, "");
  LLVMValueRef sign = LLVMBuildShl(b, LLVMBuildAnd(b, x, u32c(cg, 0x8000), ""), u32c(cg, 16), "");
  LLVMValueRef e = LLVMBuildAnd(b, x, u32c(cg, 0x7c00), ""), m = LLVMBuildAnd(b, x, u32c(cg, 0x3ff), "");
  /* normal: rebias the exponent; infinity / NaN: all-ones exponent; subnormal: m x 2^-24 exactly */
  LLVMValueRef normal = LLVMBuildAdd(b, LLVMBuildShl(b, LLVMBuildAnd(b, x, u32c(cg, 0x7fff), ""), u32c(cg, 13), ""),
                                     u32c(cg, 0x38000000), "");
  LLVMValueRef special = LLVMBuildOr(b, u32c(cg, 0x7f800000), LLVMBuildShl(b, m, u32c(cg, 13), ""), "");
  LLVMValueRef sub = bits_f32(cg, LLVMBuildFMul(b, LLVMBuildUIToFP(b, m, cg->tf32, ""), LLVMConstReal(cg->tf32, 0x1p-24), ""));
  LLVMValueRef u = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, e, u32c(cg, 0x7c00), ""), special, normal, "");
  u = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, e, u32c(cg, 0), ""), sub, u, "");
  return f32_bits(cg, LLVMBuildOr(b, u, sign, ""));
}

static LLVMValueRef f16_from_f32(CgCpu *cg, LLVMValueRef f) {
  LLVMBuilderRef b = cg->b;
  LLVMValueRef x = bits_f32(cg, f);
  LLVMValueRef sign = LLVMBuildAnd(b, LLVMBuildLShr(b, x, u32c(cg, 16), ""), u32c(cg, 0x8000), "");
  LLVMValueRef u = LLVMBuildAnd(b, x, u32c(cg, 0x7fffffff), "");
  /* normal halves: rebias, round to nearest even on the 13 bits dropped (a carry may reach infinity) */
  LLVMValueRef odd = LLVMBuildAnd(b, LLVMBuildLShr(b, u, u32c(cg, 13), ""), u32c(cg, 1), "");
  LLVMValueRef normal = LLVMBuildLShr(
      b, LLVMBuildAdd(b, LLVMBuildAdd(b, LLVMBuildSub(b, u, u32c(cg, 0x38000000), ""), u32c(cg, 0xfff), ""), odd, ""),
      u32c(cg, 13), "");
  /* subnormal halves and zero: adding 0.5 puts the value's 2^-24 steps in the low bits, rounded by the FPU */
  LLVMValueRef absf = f32_bits(cg, u);
  LLVMValueRef sub = LLVMBuildSub(b, bits_f32(cg, LLVMBuildFAdd(b, absf, LLVMConstReal(cg->tf32, 0.5), "")), u32c(cg, 0x3f000000), "");
  LLVMValueRef nan = LLVMBuildOr(b, u32c(cg, 0x7c00), LLVMBuildOr(b, u32c(cg, 0x200), LLVMBuildAnd(b, LLVMBuildLShr(b, u, u32c(cg, 13), ""), u32c(cg, 0x3ff), ""), ""), "");
  LLVMValueRef h = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntULT, u, u32c(cg, 0x38800000), ""), sub, normal, "");
  h = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntUGE, u, u32c(cg, 0x47800000), ""), u32c(cg, 0x7c00), h, "");
  h = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntUGT, u, u32c(cg, 0x7f800000), ""), nan, h, "");
  return LLVMBuildTrunc(b, LLVMBuildOr(b, h, sign, ""), cg->ti16, "");
}

LLVMValueRef cg_to_f32(CgCpu *cg, LLVMValueRef v, DType t) {
  switch (t) {
  case DT_BF16: return bf16_to_f32(cg, v);
  case DT_F16: return f16_to_f32(cg, v);
  case DT_F64: return LLVMBuildFPTrunc(cg->b, v, cg->tf32, "");
  case DT_I32:
  case DT_I64:
  case DT_BOOL: return LLVMBuildSIToFP(cg->b, v, cg->tf32, "");
  default: return v;
  }
}

/* Integers are truncated toward zero, as interp's cast. */
LLVMValueRef cg_from_f32(CgCpu *cg, LLVMValueRef v, DType t) {
  switch (t) {
  case DT_BF16: return bf16_from_f32(cg, v);
  case DT_F16: return f16_from_f32(cg, v);
  case DT_F64: return LLVMBuildFPExt(cg->b, v, cg->tf64, "");
  case DT_I32:
  case DT_I64:
  case DT_BOOL: return LLVMBuildFPToSI(cg->b, cg_trunc(cg, v), cg_elem_type(cg, t), "");
  default: return v;
  }
}

void cg_return_if_failed(CgCpu *cg, LLVMValueRef fn, LLVMValueRef rc, LLVMValueRef ret) {
  LLVMBasicBlockRef bad = LLVMAppendBasicBlockInContext(cg->ctx, fn, "failed");
  LLVMBasicBlockRef ok = LLVMAppendBasicBlockInContext(cg->ctx, fn, "ok");
  LLVMBuildCondBr(cg->b, LLVMBuildICmp(cg->b, LLVMIntNE, rc, cg_i32(cg, 0), ""), bad, ok);
  LLVMPositionBuilderAtEnd(cg->b, bad);
  LLVMBuildRet(cg->b, ret);
  LLVMPositionBuilderAtEnd(cg->b, ok);
}
