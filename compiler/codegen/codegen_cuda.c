/* codegen_cuda.c - the CUDA back end: CUDA C for the fused kernels of a
 * module, behind the back-end interface (codegen.h).
 *
 * Loop, row, copy and fill kernels are generated from the same loop nests
 * the CPU back end lowers (nest.h), so both back ends read memory through
 * one composition of index maps:
 *   loop  one __global__ over the collapsed iteration space, a grid-stride
 *         loop with one point per thread;
 *   row   one block per row (the axes outside the reduced group), the
 *         block's threads striding over the group; one sweep per level of
 *         reduction (a layernorm: mean, variance, output), each closed by a
 *         warp-shuffle + shared-memory block reduction (hpdl_cuda.cuh);
 *   copy, fill  one launch per step of nest_build_steps (a pad's zero fill
 *         before its interior), in order.
 * Every kernel takes the kernel context (hpdl_kctx: seed, layer, group
 * ranks) and then one pointer per kernel input and output (fuse.h's
 * lists), typed by the IR's dtype; values are computed in fp32 and stored
 * in their dtype, as the CPU back end does. GEMMs are recorded for cuBLASLt
 * (stageS.kernels.json) with their epilogue generated; special kernels are
 * codegen_cuda_special.c's. An extern call runs on the host, so a module
 * with one has no complete CUDA form yet: generate() fails naming it, and a
 * `--target cuda` compile never writes a partial artifact. `hpdlc emit
 * cuda` prints the source; docs/backend.md describes it. */
#include "codegen_cuda.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dirent.h>
#include <sys/stat.h>

#include <jansson.h>

#include "codegen_cuda_int.h"
#include "cudacc.h"
#include "fscopy.h"
#include "xalloc.h"

/* ---- text, errors, launches ---- */

static void tx_vadd(CuText *t, const char *fmt, va_list ap) {
  va_list aq;
  va_copy(aq, ap);
  int n = vsnprintf(NULL, 0, fmt, aq);
  va_end(aq);
  if (n < 0) return;
  if (t->len + (size_t)n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 4096;
    while (t->len + (size_t)n + 1 > cap) cap *= 2;
    t->s = xalloc_realloc(t->s, cap);
    t->cap = cap;
  }
  vsnprintf(t->s + t->len, (size_t)n + 1, fmt, ap);
  t->len += (size_t)n;
}

void cu_tx(CuText *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tx_vadd(t, fmt, ap);
  va_end(ap);
}

void cu_fail(CgTarget *t, const char *fmt, ...) {
  if (t->failed) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->err, sizeof t->err, fmt, ap);
  va_end(ap);
  t->failed = 1;
}

void cu_add_launch(CuKern *k, const char *name, int step, const char *kind, int64_t grid, int64_t block) {
  CgTarget *t = k->t;
  if (t->nlaunch == t->caplaunch) {
    t->caplaunch = t->caplaunch ? 2 * t->caplaunch : 64;
    t->launch = xalloc_realloc(t->launch, sizeof(CuLaunch) * (size_t)t->caplaunch);
  }
  CuLaunch *l = &t->launch[t->nlaunch++];
  memset(l, 0, sizeof *l);
  snprintf(l->name, sizeof l->name, "%s", name);
  l->graph = k->gi;
  l->kernel = k->kp;
  l->step = step;
  l->kind = kind;
  l->grid = grid < 1 ? 1 : grid > CU_MAX_GRID ? CU_MAX_GRID : grid;
  l->block = block;
  t->stats.kernels++;
  if (t->opt.emulate && strcmp(kind, "gemm") && strcmp(kind, "grouped") && strcmp(kind, "host")) {
    const FuseKernel *K = k->K;
    cu_tx(&k->stub, "  if (HPDL_EMU_LAUNCH(%s, dim3(%" PRId64 "), dim3(%" PRId64 "), 0, *ctx", name, l->grid, l->block);
    for (int i = 0; i < K->ninputs + K->noutputs; i++) {
      int v = i < K->ninputs ? K->inputs[i] : K->outputs[i - K->ninputs];
      cu_tx(&k->stub, ", (%s%s *)io[%d]", i < K->ninputs ? "const " : "", cu_c_type(k->fg->graph->nodes[v].dtype), i);
    }
    cu_tx(&k->stub, ")) return 1;\n");
    /* the launch alone, with the host's grid and block (runtime/device/device_emu.c) */
    cu_tx(&t->emu, "extern \"C\" int hpd_emul_%s(const hpdl_kctx *ctx, unsigned grid, unsigned block, void **io) {\n"
                   "  return HPDL_EMU_LAUNCH(%s, dim3(grid), dim3(block), 0, *ctx", name, name);
    for (int i = 0; i < K->ninputs + K->noutputs; i++) {
      int v = i < K->ninputs ? K->inputs[i] : K->outputs[i - K->ninputs];
      cu_tx(&t->emu, ", (%s%s *)io[%d]", i < K->ninputs ? "const " : "", cu_c_type(k->fg->graph->nodes[v].dtype), i);
    }
    cu_tx(&t->emu, ");\n}\n\n");
  }
}

static void nest_fail_cb(void *be, const char *msg) { cu_fail(((CuKern *)be)->t, "%s", msg); }

/* Element types the generated code loads and stores (as the CPU back end;
 * bf16 and fp16 as their bits, converted by hpdl_cuda.cuh). */
static int cu_dtype_ok(DType t) {
  return t == DT_F32 || t == DT_F64 || t == DT_BF16 || t == DT_F16 || t == DT_I32 || t == DT_I64 || t == DT_BOOL;
}

const char *cu_c_type(DType t) {
  switch (t) {
  case DT_F64: return "double";
  case DT_BF16:
  case DT_F16: return "unsigned short";
  case DT_I32: return "int";
  case DT_I64: return "long long";
  case DT_BOOL: return "unsigned char";
  default: return "float";
  }
}

static const IrNode *nd(const CuKern *k, int id) { return &k->fg->graph->nodes[id]; }

int cu_io_index(const CuKern *k, int v) {
  for (int i = 0; i < k->K->ninputs; i++)
    if (k->K->inputs[i] == v) return i;
  for (int i = 0; i < k->K->noutputs; i++)
    if (k->K->outputs[i] == v) return k->K->ninputs + i;
  return -1;
}

/* ---- expressions of a nest ---- */

typedef struct {
  CuKern *k;
  Nest *N;
  CuText *o;
  int *scope_of; /* per expression: the scope its variable was defined in, -1 none */
  int scope;     /* the scope being emitted */
  int row_scope; /* the row's own scope (its values outlive the sweeps) */
  int in_sweep;  /* the group axes' indices are defined */
  int row;       /* a row kernel: outside a sweep, the group's axes count 0 */
  const char *ind;
  /* 128-bit vectors: four consecutive points of the innermost axis a thread,
   * lane 0..3 each with its own variables v<x>_<lane> */
  int vec, lane;
  int *qdone;    /* per expression: its float4 load is emitted (scope) */
  int col;       /* a row kernel in columns: 32 rows a block, the group over warps */
  int64_t split; /* a column kernel's group in this many chunks, a block each (col_split) */
  /* a column kernel four outputs a thread (col4): the lanes are four
   * neighbouring rows, each with its own reductions; lscalar: the lanes'
   * loads and stores one value at a time (the buffers not aligned) */
  int col4, lscalar;
  int wrow; /* a row kernel a warp per row (CU_WROW_MAX): the group over its lanes, warp reductions */
  /* a warp's row held in registers (row_cache): rc_nit vector steps a lane,
   * rcache[x] 1 for a load to keep (c<x>_[it_]), 2 once a sweep has loaded it */
  int64_t rc_nit;
  char *rcache;
} Emit;

/* An affine form over the collapsed axes in scope (others count 0). */
static void aff_text(Emit *E, const NestAff *a, CuText *o) {
  Nest *N = E->N;
  cu_tx(o, "(%" PRId64 "LL", a->c);
  for (int t = 0; t < N->na; t++) {
    int64_t c = a->coef[N->alast[t]];
    if (!c || (E->row && N->aset[t] == 1 && !E->in_sweep)) continue;
    if (c == 1) cu_tx(o, " + i%d", t);
    else cu_tx(o, " + i%d * %" PRId64 "LL", t, c);
  }
  if (a->dax >= 0 && a->dcoef) {
    int t = N->axis_of[a->dax];
    if (t >= 0 && !(E->row && N->aset[t] == 1 && !E->in_sweep))
      cu_tx(o, " + (i%d / %" PRId64 "LL) * %" PRId64 "LL", t, a->dq, a->dcoef);
  }
  cu_tx(o, ")");
}

static const char *unary_fmt(IrOp op) {
  switch (op) {
  case IR_NEG: return "-(%s)";
  case IR_RELU: return "(%1$s > 0.0f ? %1$s : 0.0f)";
  case IR_GELU: return "hpdl_gelu(%s)";
  case IR_SILU: return "(%1$s * hpdl_sigmoid(%1$s))";
  case IR_SIGMOID: return "hpdl_sigmoid(%s)";
  case IR_TANH: return "tanhf(%s)";
  case IR_EXP: return "expf(%s)";
  case IR_LOG: return "logf(%s)";
  case IR_SQRT: return "sqrtf(%s)";
  case IR_RSQRT: return "(1.0f / sqrtf(%s))";
  case IR_ABS: return "fabsf(%s)";
  case IR_SQUARE: return "(%1$s * %1$s)";
  case IR_CAST: return "%s";
  default: return NULL;
  }
}

/* The derivative of an activation at x (the CPU back end's cg_unary_deriv). */
static const char *deriv_fmt(IrOp op) {
  switch (op) {
  case IR_NEG: return "-1.0f";
  case IR_CAST: return "1.0f";
  case IR_RELU: return "(%1$s > 0.0f ? 1.0f : 0.0f)";
  case IR_GELU: return "hpdl_gelu_grad(%s)";
  case IR_SIGMOID: return "(hpdl_sigmoid(%1$s) * (1.0f - hpdl_sigmoid(%1$s)))";
  case IR_SILU: return "(hpdl_sigmoid(%1$s) + (%1$s * hpdl_sigmoid(%1$s)) * (1.0f - hpdl_sigmoid(%1$s)))";
  case IR_TANH: return "(1.0f - tanhf(%1$s) * tanhf(%1$s))";
  case IR_EXP: return "expf(%s)";
  case IR_LOG: return "(1.0f / %s)";
  case IR_SQRT: return "(0.5f / sqrtf(%s))";
  case IR_RSQRT: return "(-0.5f / (%1$s * sqrtf(%1$s)))";
  case IR_ABS: return "hpdl_abs_grad(%s)";
  case IR_SQUARE: return "(2.0f * %s)";
  default: return NULL;
  }
}

static void fmt1(CuText *o, const char *fmt, const char *a) {
  /* formats use %s or %1$s only: substitute by hand (no positional printf needed) */
  for (const char *p = fmt; *p; p++) {
    if (p[0] == '%' && p[1] == 's') {
      cu_tx(o, "%s", a);
      p++;
    } else if (!strncmp(p, "%1$s", 4)) {
      cu_tx(o, "%s", a);
      p += 3;
    } else {
      cu_tx(o, "%c", *p);
    }
  }
}

void cu_float(CuText *o, double v) {
  if (v != v) cu_tx(o, "(0.0f / 0.0f)");
  else if (v > 3.4e38) cu_tx(o, "(-HPDL_NEG_INF)");
  else if (v < -3.4e38) cu_tx(o, "HPDL_NEG_INF");
  else {
    char b[40];
    snprintf(b, sizeof b, "%.9g", v);
    cu_tx(o, "%s%sf", b, strpbrk(b, ".e") ? "" : ".0");
  }
}

/* Defines v<xi> in the current scope (after its operands) and returns 0, or
 * -1 after cu_fail. X_RED values are defined by their sweep. */
static int *scope_slot(Emit *E, int xi) { return &E->scope_of[xi * 4 + E->lane]; }

static const char *vname(const Emit *E, int xi, char *buf, size_t n) {
  /* a reduction is the row's one value, whatever the lane */
  if (E->vec && (E->col4 || !(xi >= 0 && E->N->x[xi].kind == X_RED))) snprintf(buf, n, "v%d_%d", xi, E->lane);
  else snprintf(buf, n, "v%d", xi);
  return buf;
}

int cu_vec_type(DType t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

void cu_store4(CuText *o, const char *ind, int io, DType dt, const char *at, const char *const v[4]) {
  if (dt == DT_F32) {
    cu_tx(o, "%s*(float4 *)(p%d + %s) = make_float4(%s, %s, %s, %s);\n", ind, io, at, v[0], v[1], v[2], v[3]);
    return;
  }
  const char *f = dt == DT_BF16 ? "hpdl_bf16_from_f32" : "hpdl_f16_from_f32";
  cu_tx(o, "%s*(uint2 *)(p%d + %s) = make_uint2((unsigned)%s(%s) | (unsigned)%s(%s) << 16, (unsigned)%s(%s) | (unsigned)%s(%s) << 16);\n",
        ind, io, at, f, v[0], f, v[1], f, v[2], f, v[3]);
}

/* A load the vector path reads as a float4 (or a uint2 of 16-bit values): unit stride along the
 * innermost collapsed axis, and 16-byte aligned for every group of four
 * (the other terms multiples of 4; the base pointer is checked at run time). */
static int vec_access(const Nest *N, const NestAff *a) {
  int inner = N->alast[N->na - 1];
  if (a->coef[inner] != 1 || a->c % 4) return 0;
  for (int t = 0; t + 1 < N->na; t++)
    if (a->coef[N->alast[t]] % 4) return 0;
  for (int j = 0; j < N->R; j++)
    if (N->axis_of[j] == N->na - 1 && j != inner && a->coef[j] % 4) return 0;
  return !(a->dax >= 0 && a->dcoef && (N->axis_of[a->dax] == N->na - 1 || a->dcoef % 4));
}

/* A load whose four lanes are four neighbouring values (the innermost
 * collapsed axis at unit stride: collapsing kept every access linear in
 * it) though not a vector: a row of 65 values, an odd offset. The vector
 * path reads its lanes one value at a time. */
static int unit_walk(const Nest *N, const NestAff *a) {
  if (a->coef[N->alast[N->na - 1]] != 1) return 0;
  return !(a->dax >= 0 && a->dcoef && N->axis_of[a->dax] == N->na - 1);
}

static int ex(Emit *E, int xi) {
  Nest *N = E->N;
  NestX *x = &N->x[xi];
  int *so = scope_slot(E, xi);
  if (*so == E->scope || (*so == E->row_scope && *so >= 0)) return 0;
  if (x->kind == X_RED) {
    cu_fail(E->k->t, "graph %s kernel k%d: a reduction is read before its sweep", E->k->fg->graph->name, E->k->kp);
    return -1;
  }
  if (x->a >= 0 && ex(E, x->a)) return -1;
  if (x->b >= 0 && ex(E, x->b)) return -1;
  CuText *o = E->o;
  char a[24], b[24], me[24];
  vname(E, x->a, a, sizeof a);
  vname(E, x->b, b, sizeof b);
  vname(E, xi, me, sizeof me);
  if (E->vec && x->kind == X_LOAD && unit_walk(N, &x->off) &&
      (E->lscalar || !cu_vec_type(x->dt) || !vec_access(N, &x->off))) {
    /* lane l's value alone: the next point of the innermost axis */
    int half = x->dt == DT_BF16 || x->dt == DT_F16;
    cu_tx(o, "%sconst float %s = %sp%d[", E->ind, me, x->dt == DT_BF16 ? "hpdl_bf16_to_f32(" : x->dt == DT_F16 ? "hpdl_f16_to_f32(" : "(float)",
          cu_io_index(E->k, x->mem));
    aff_text(E, &x->off, o);
    cu_tx(o, " + %d%s;\n", E->lane, half ? "])" : "]");
    *so = E->scope;
    return 0;
  }
  if (E->vec && x->kind == X_LOAD && cu_vec_type(x->dt) && vec_access(N, &x->off)) {
    int half = x->dt != DT_F32; /* four 16-bit values: 8 bytes, a uint2 */
    if (E->qdone[xi] != E->scope) {
      int kept = E->rcache && E->rcache[xi];
      if (kept && E->rcache[xi] == 2) { /* a later sweep: the registers the first one filled */
        cu_tx(o, "%sconst %s q%d = c%d_[it_];\n", E->ind, half ? "uint2" : "float4", xi, xi);
      } else {
        cu_tx(o, "%sconst %s q%d = *(const %s *)(p%d + ", E->ind, half ? "uint2" : "float4", xi, half ? "uint2" : "float4",
              cu_io_index(E->k, x->mem));
        aff_text(E, &x->off, o);
        cu_tx(o, ");\n");
        if (kept) {
          cu_tx(o, "%sc%d_[it_] = q%d;\n", E->ind, xi, xi);
          E->rcache[xi] = 2;
        }
      }
      E->qdone[xi] = E->scope;
    }
    if (half) /* lane l: the low (even l) or high half of word l / 2 */
      cu_tx(o, "%sconst float %s = hpdl_%s_to_f32((unsigned short)(q%d.%c >> %d));\n", E->ind, me,
            x->dt == DT_BF16 ? "bf16" : "f16", xi, "xy"[E->lane / 2], 16 * (E->lane & 1));
    else cu_tx(o, "%sconst float %s = q%d.%c;\n", E->ind, me, xi, "xyzw"[E->lane]);
    *so = E->scope;
    return 0;
  }
  cu_tx(o, "%sconst float %s = ", E->ind, me);
  switch (x->kind) {
  case X_CONST: cu_float(o, x->p); break;
  case X_LOAD: {
    int io = cu_io_index(E->k, x->mem);
    if (io < 0) {
      cu_fail(E->k->t, "graph %s kernel k%d: %%%d is neither an input nor an output of the kernel", E->k->fg->graph->name,
              E->k->kp, x->mem);
      return -1;
    }
    cu_tx(o, "%sp%d[", x->dt == DT_BF16 ? "hpdl_bf16_to_f32(" : x->dt == DT_F16 ? "hpdl_f16_to_f32(" : "(float)", io);
    aff_text(E, &x->off, o);
    cu_tx(o, x->dt == DT_BF16 || x->dt == DT_F16 ? "])" : "]");
    break;
  }
  case X_UN: {
    if (x->op == IR_POWS) {
      cu_tx(o, "hpdl_pows(%s, ", a);
      cu_float(o, x->p);
      cu_tx(o, ")");
      break;
    }
    const char *f = unary_fmt(x->op);
    if (!f) {
      cu_fail(E->k->t, "no CUDA rule for unary op %s", ir_op_name(x->op));
      return -1;
    }
    fmt1(o, f, a);
    break;
  }
  case X_BIN:
    switch (x->op) {
    case IR_ADD: cu_tx(o, "%s + %s", a, b); break;
    case IR_SUB: cu_tx(o, "%s - %s", a, b); break;
    case IR_MUL: cu_tx(o, "%s * %s", a, b); break;
    case IR_DIV: cu_tx(o, "%s / %s", a, b); break;
    case IR_MAXIMUM: cu_tx(o, "(%1$s > %2$s ? %1$s : %2$s)", a, b); break;
    case IR_MINIMUM: cu_tx(o, "(%1$s < %2$s ? %1$s : %2$s)", a, b); break;
    default: cu_fail(E->k->t, "no CUDA rule for binary op %s", ir_op_name(x->op)); return -1;
    }
    break;
  case X_ACTGRAD: {
    if (x->op == IR_POWS) {
      cu_tx(o, "(");
      cu_float(o, x->p);
      cu_tx(o, " * hpdl_pows(%s, ", a);
      cu_float(o, x->p - 1.0);
      cu_tx(o, ")) * %s", b);
      break;
    }
    const char *f = deriv_fmt(x->op);
    if (!f) {
      cu_fail(E->k->t, "act_grad of %s has no CUDA derivative rule", ir_op_name(x->op));
      return -1;
    }
    cu_tx(o, "(");
    fmt1(o, f, a);
    cu_tx(o, ") * %s", b);
    break;
  }
  case X_CASTI: cu_tx(o, "truncf(%s)", a); break;
  case X_ROUND: cu_tx(o, "hpdl_%1$s_to_f32(hpdl_%1$s_from_f32(%2$s))", x->dt == DT_BF16 ? "bf16" : "f16", a); break;
  case X_INDEX:
    cu_tx(o, "(float)");
    aff_text(E, &x->off, o);
    break;
  case X_MASK: {
    int tr = N->axis_of[N->R - 2], tc = N->axis_of[N->R - 1];
    char row[24] = "0LL", col[24] = "0LL", rowx[160], colx[160];
    if (tr >= 0) snprintf(row, sizeof row, "i%d", tr);
    if (tc >= 0) snprintf(col, sizeof col, "i%d", tc);
    snprintf(rowx, sizeof rowx, "%s", row);
    snprintf(colx, sizeof colx, "%s", col);
    if (x->attr || x->attr_cols) {
      /* context parallelism: global positions of the rank's zigzag rows and
       * of the ring's key blocks (the CPU back end's zigzag_pos, ring_col_pos) */
      int grp = (int)((x->attr ? x->attr : x->attr_cols) - 1);
      if (x->attr)
        snprintf(rowx, sizeof rowx, "hpdl_zigzag_pos(hpd.rank[%d], hpd.size[%d], %" PRId64 "LL, %s)", grp, grp, N->D[N->R - 2], row);
      if (x->attr_cols)
        snprintf(colx, sizeof colx, "hpdl_ring_col_pos(hpd.rank[%d], hpd.size[%d], %" PRId64 "LL, %s)", grp, grp, N->D[N->R - 1], col);
    }
    cu_tx(o, "(%s > %s ? ", colx, rowx);
    cu_float(o, x->p);
    cu_tx(o, " : %s)", a);
    break;
  }
  case X_VMASK:
    /* the vocabulary's padding: global column >= below reads as the fill */
    cu_tx(o, "((");
    if (x->attr) cu_tx(o, "(long long)hpd.rank[%d] * %" PRId64 "LL + ", (int)(x->attr - 1), x->cols);
    aff_text(E, &x->off, o);
    cu_tx(o, ") >= %" PRId64 "LL ? ", x->below);
    cu_float(o, x->p);
    cu_tx(o, " : %s)", a);
    break;
  case X_DROP:
    if (x->p >= 1) {
      cu_tx(o, "0.0f");
    } else {
      cu_tx(o, "(hpdl_keep(drop_base%d, ", xi);
      aff_text(E, &x->off, o);
      cu_tx(o, ", %.17g) ? %s / ", x->p, a);
      cu_float(o, 1.0 - x->p);
      cu_tx(o, " : 0.0f)");
    }
    break;
  case X_RED: break;
  }
  cu_tx(o, ";\n");
  *so = E->scope;
  return 0;
}

/* Index variables i<t> of the collapsed axes whose set is `set` (-1: all),
 * from the linear index `lin`, row-major. */
static int in_set(const Nest *N, int t, int set) { return set < 0 || (set == 1 ? N->aset[t] == 1 : N->aset[t] != 1); }

/* Index variables i<t> of the collapsed axes of `set` (-1 all, 1 the
 * reduced group, 0 the others) from the linear index `lin`, row-major. */
static void decompose(CuText *o, const Nest *N, int set, const char *lin, const char *ind) {
  int first = -1, any = 0;
  for (int t = 0; t < N->na; t++)
    if (in_set(N, t, set)) {
      if (first < 0) first = t;
      any = 1;
    }
  if (!any) return;
  const char *r = set == 1 ? "rg_" : "r_";
  /* under 2^31 points, the divisions in 32 bits: a division by a constant is then a
   * multiply-high and a shift, where 64 bits take a dozen instructions (the scalar
   * loops' index arithmetic, not their memory, was their limit) */
  int64_t n = 1;
  for (int t = 0; t < N->na; t++)
    if (in_set(N, t, set)) n *= N->adim[t];
  if (n <= 0x7fffffffLL) {
    /* the indices stay 32-bit too (every use widens them: the offsets' 64-bit
     * constants, a mask's comparison of two of them): 64-bit ones took the
     * registers that the unrolled grid-stride loop's loads need (spills at 32) */
    cu_tx(o, "%sunsigned %s = (unsigned)(%s);\n", ind, r, lin);
    for (int t = N->na - 1; t >= 0; t--) {
      if (!in_set(N, t, set)) continue;
      if (t == first) cu_tx(o, "%sconst unsigned i%d = %s;\n", ind, t, r);
      else cu_tx(o, "%sconst unsigned i%d = %s %% %" PRId64 "u; %s /= %" PRId64 "u;\n", ind, t, r, N->adim[t], r, N->adim[t]);
    }
    return;
  }
  cu_tx(o, "%slong long %s = %s;\n", ind, r, lin);
  for (int t = N->na - 1; t >= 0; t--) {
    if (!in_set(N, t, set)) continue;
    if (t == first) cu_tx(o, "%sconst long long i%d = %s;\n", ind, t, r);
    else cu_tx(o, "%sconst long long i%d = %s %% %" PRId64 "LL; %s /= %" PRId64 "LL;\n", ind, t, r, N->adim[t], r, N->adim[t]);
  }
}

static int64_t space(const Nest *N, int set) {
  int64_t n = 1;
  for (int t = 0; t < N->na; t++)
    if (in_set(N, t, set)) n *= N->adim[t];
  return n;
}

/* The stores selected (full or not): every value first, then every store,
 * so an output written in place of an input never clobbers an element
 * another output still reads (the CPU back end's order). */
static int stores(Emit *E, int full) {
  Nest *N = E->N;
  for (int i = 0; i < N->nst; i++)
    if (N->st[i].full == full && N->x[N->st[i].x].kind != X_RED && ex(E, N->st[i].x)) return -1;
  for (int i = 0; i < N->nst; i++) {
    NestStore *s = &N->st[i];
    if (s->full != full) continue;
    int io = cu_io_index(E->k, s->val);
    if (io < 0) {
      cu_fail(E->k->t, "graph %s kernel k%d: output %%%d is not an output of the kernel", E->k->fg->graph->name, E->k->kp,
              s->val);
      return -1;
    }
    const char *ct = cu_c_type(s->dt);
    cu_tx(E->o, "%sp%d[", E->ind, io);
    aff_text(E, &s->off, E->o);
    if (s->dt == DT_F32) cu_tx(E->o, "] %s v%d;\n", s->add ? "+=" : "=", s->x);
    else if ((s->dt == DT_BF16 || s->dt == DT_F16) && s->add) {
      cu_fail(E->k->t, "graph %s kernel k%d: a scatter-add into 16-bit storage", E->k->fg->graph->name, E->k->kp);
      return -1;
    } else if (s->dt == DT_BF16 || s->dt == DT_F16)
      cu_tx(E->o, "] = hpdl_%s_from_f32(v%d);\n", s->dt == DT_BF16 ? "bf16" : "f16", s->x);
    else if (s->dt == DT_F64) cu_tx(E->o, "] %s (double)v%d;\n", s->add ? "+=" : "=", s->x);
    else cu_tx(E->o, "] %s (%s)truncf(v%d);\n", s->add ? "+=" : "=", ct, s->x);
  }
  return 0;
}

void cu_signature(CuKern *k, CuText *o, const char *name) { cu_signature_min(k, o, name, 0); }

void cu_kernel_base(const FuseGraph *fg, int kp, char *buf, size_t n) {
  char sym[128];
  cg_graph_symbol(fg->graph->name, sym, sizeof sym);
  snprintf(buf, n, "hpd_%s_k%d", sym + strlen("hpd_graph_"), kp);
}

void cu_signature_min(CuKern *k, CuText *o, const char *name, int min_blocks) {
  cu_signature_bounds(k, o, name, CU_BLOCK, min_blocks);
}

void cu_signature_bounds(CuKern *k, CuText *o, const char *name, int max_threads, int min_blocks) {
  const FuseKernel *K = k->K;
  if (min_blocks > 0)
    cu_tx(o, "extern \"C\" __global__ void __launch_bounds__(%d, %d) %s(const hpdl_kctx hpd", max_threads, min_blocks, name);
  else cu_tx(o, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const hpdl_kctx hpd", max_threads, name);
  for (int i = 0; i < K->ninputs + K->noutputs; i++) {
    int v = i < K->ninputs ? K->inputs[i] : K->outputs[i - K->ninputs];
    cu_tx(o, ", %s%s *__restrict__ p%d", i < K->ninputs ? "const " : "", cu_c_type(nd(k, v)->dtype), i);
  }
  cu_tx(o, ") {\n");
}

/* Dropout's per-call base hash (interp_hash_name(seed ^ stream * phi,
 * "dropout", layer)), as the CPU back end computes it. */
static void drop_bases(Emit *E) {
  Nest *N = E->N;
  for (int i = 0; i < N->nx; i++) {
    NestX *x = &N->x[i];
    if (x->kind != X_DROP || x->p <= 0 || x->p >= 1) continue;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = "dropout"; *p; p++) {
      h ^= (unsigned char)*p;
      h *= 0x100000001b3ull;
    }
    cu_tx(E->o, "  const unsigned long long drop_base%d = hpdl_splitmix(hpdl_splitmix(hpd.seed ^ %" PRIu64 "ULL ^ %" PRIu64
             "ULL) ^ (unsigned long long)hpd.layer * 0xD1B54A32D192ED03ULL);\n",
       i, (uint64_t)((uint64_t)x->attr * 0x9E3779B97F4A7C15ull), (uint64_t)h);
  }
}

/* A nest the vector path can run (row: a row kernel's sweeps): f32, bf16
 * or f16 values, the innermost collapsed axis a multiple of 4 long (and, in a row
 * kernel, part of the reduced group), every store (a row kernel's full
 * ones) and every load that walks that axis at unit stride (vec_access),
 * loads that do not walk it broadcast, and no expression that needs the
 * point's own index (an iota, a mask, dropout's stream). */
static int vectorizable(const Nest *N, int row) {
  if (N->na < 1 || N->adim[N->na - 1] % 4 || N->nst == 0) return 0;
  /* row 2: a column kernel's (the innermost axis a row axis, every store) */
  if (row == 1 && N->aset[N->na - 1] != 1) return 0;
  if (row == 2 && N->aset[N->na - 1] == 1) return 0;
  int inner = N->alast[N->na - 1];
  for (int i = 0; i < N->nst; i++) {
    if (row == 1 && !N->st[i].full) continue;
    if (!cu_vec_type(N->st[i].dt) || N->st[i].add || !vec_access(N, &N->st[i].off)) return 0;
  }
  for (int i = 0; i < N->nx; i++) {
    const NestX *x = &N->x[i];
    if (x->kind == X_INDEX || x->kind == X_MASK || x->kind == X_VMASK || (x->kind == X_DROP && x->p > 0 && x->p < 1) || (!row && x->kind == X_RED))
      return 0;
    if (x->kind != X_LOAD) continue;
    int walks = x->off.coef[inner] != 0;
    for (int j = 0; j < N->R; j++) walks |= N->axis_of[j] == N->na - 1 && x->off.coef[j] != 0;
    if (x->off.dax >= 0 && x->off.dcoef && N->axis_of[x->off.dax] == N->na - 1) walks = 1;
    /* a vector, or four neighbours read one at a time (unit_walk) */
    if (walks && !((cu_vec_type(x->dt) && vec_access(N, &x->off)) || unit_walk(N, &x->off))) return 0;
  }
  return 1;
}

/* `if (every io pointer is 16-byte aligned) {` */
static void if_aligned(CuKern *k, CuText *o, const char *ind) {
  cu_tx(o, "%sif (((0ULL", ind);
  for (int i = 0; i < k->K->ninputs + k->K->noutputs; i++) cu_tx(o, " | (unsigned long long)p%d", i);
  cu_tx(o, ") & 15ULL) == 0) {\n");
}

static int has_red(const Nest *N) {
  for (int i = 0; i < N->nx; i++)
    if (N->x[i].kind == X_RED) return 1;
  return 0;
}

/* The vector path's stores: every lane's values first, then one float4
 * store per store (only the full ones with full_only: a row kernel's). */
static int vec_stores(Emit *E, int full_only) {
  Nest *N = E->N;
  int rc = 0;
  E->vec = 1;
  for (E->lane = 0; E->lane < 4 && !rc; E->lane++)
    for (int i = 0; i < N->nst && !rc; i++)
      if ((!full_only || N->st[i].full) && N->x[N->st[i].x].kind != X_RED) rc = ex(E, N->st[i].x);
  for (int i = 0; i < N->nst && !rc; i++) {
    NestStore *st = &N->st[i];
    if (full_only && !st->full) continue;
    char c[4][24];
    const char *v[4] = {c[0], c[1], c[2], c[3]};
    for (E->lane = 0; E->lane < 4; E->lane++) vname(E, st->x, c[E->lane], sizeof c[0]);
    CuText at = {0};
    aff_text(E, &st->off, &at);
    cu_store4(E->o, E->ind, cu_io_index(E->k, st->val), st->dt, at.s ? at.s : "0", v);
    free(at.s);
  }
  E->vec = 0;
  E->lane = 0;
  return rc;
}

/* A column kernel's four lanes' stores (the full ones, or the row-level
 * ones) one value at a time, each at the next point of the innermost axis
 * (vectorizable(N, 2): every store walks it at unit stride). */
static int lane_stores(Emit *E, int full) {
  Nest *N = E->N;
  int rc = 0, lscalar = E->lscalar;
  E->vec = 1;
  E->lscalar = 1;
  for (E->lane = 0; E->lane < 4 && !rc; E->lane++)
    for (int i = 0; i < N->nst && !rc; i++)
      if (N->st[i].full == full && N->x[N->st[i].x].kind != X_RED) rc = ex(E, N->st[i].x);
  for (E->lane = 0; E->lane < 4 && !rc; E->lane++)
    for (int i = 0; i < N->nst; i++) {
      NestStore *st = &N->st[i];
      if (st->full != full) continue;
      char v[24];
      vname(E, st->x, v, sizeof v);
      cu_tx(E->o, "%sp%d[", E->ind, cu_io_index(E->k, st->val));
      aff_text(E, &st->off, E->o);
      if (st->dt == DT_F32) cu_tx(E->o, " + %d] = %s;\n", E->lane, v);
      else cu_tx(E->o, " + %d] = hpdl_%s_from_f32(%s);\n", E->lane, st->dt == DT_BF16 ? "bf16" : "f16", v);
    }
  E->vec = 0;
  E->lane = 0;
  E->lscalar = lscalar;
  return rc;
}

/* Opens a sweep over the row's group in a new scope: the float4 loop (v4,
 * four points a thread) or the scalar one, under `if (vec_)` / `} else {`
 * when the kernel has both. */
static void sweep_open(Emit *E, int vec, int v4, int64_t ngrp, int *sweep) {
  CuText *o = E->o;
  if (vec) cu_tx(o, v4 ? "    if (vec_) {\n" : "    } else {\n");
  /* (col4: its four lanes are the loads in flight the unrolling gave) */
  const char *unroll = E->col4 ? "" : "    HPDL_UNROLL4\n";
  if (E->split > 1) cu_tx(o, "%s    for (long long grp = glo_ + cy_; live_ && grp < ghi_; grp += cny_) {\n", unroll);
  else if (E->col) cu_tx(o, "%s    for (long long grp = cy_; live_ && grp < %" PRId64 "LL; grp += cny_) {\n", unroll, ngrp);
  /* a warp's row: 32-bit counters (CU_WROW_MAX), which left ptxas the
   * registers its occupancy target allows (64-bit ones spilled) */
  else if (E->wrow && v4 && E->rcache) {
    /* the row in registers: a constant trip count, unrolled whole, so every
     * c<x>_[it_] is a register and each step's loads are in flight at once */
    cu_tx(o, "    HPDL_UNROLL_ALL\n    for (int it_ = 0, grp = lane_ * 4; it_ < %" PRId64, E->rc_nit);
    if (ngrp % 128) cu_tx(o, " && grp < %" PRId64, ngrp);
    cu_tx(o, "; it_++, grp += 128) {\n");
  } else if (E->wrow && v4) {
    /* a row too long to keep (Llama's 4096 fp32 values: 32 steps a lane):
     * four steps' loads in flight a lane, not one */
    cu_tx(o, "    HPDL_UNROLL4\n    for (int grp = lane_ * 4; grp < %" PRId64 "; grp += 128) {\n", ngrp);
  }
  else if (E->wrow) cu_tx(o, "    HPDL_ROLLED\n    for (int grp = lane_; grp < %" PRId64 "; grp += 32) {\n", ngrp);
  else if (v4) cu_tx(o, "    for (long long grp = threadIdx.x * 4LL; grp < %" PRId64 "LL; grp += blockDim.x * 4LL) {\n", ngrp);
  else cu_tx(o, "    for (long long grp = threadIdx.x; grp < %" PRId64 "LL; grp += blockDim.x) {\n", ngrp);
  E->ind = "      ";
  decompose(o, E->N, 1, "grp", E->ind);
  E->scope = ++*sweep;
  E->in_sweep = 1;
}

/* A column kernel (one level of sums or maxima over leading axes: a bias's
 * gradient) has a block per CU_COL_ROWS outputs; over 768 outputs that is
 * 96 blocks, too few to fill a GPU (an H100 has 132 SMs), and each walks
 * all of the group (4096 rows of a GPT-2 step): about 700 GB/s. So the group
 * is cut in chunks, a block per chunk of each column block (about
 * CU_COL_TARGET_BLOCKS in all); each block writes its chunk's partial value
 * to the module's scratch, and the last block of a column block to finish
 * (an atomic count) adds the partials in chunk order and stores the
 * outputs: the same sums every run. Only where no full output reads a
 * reduced value (those would need the total in every chunk). Returns the
 * chunks, 1 for none. About 1024 blocks of 256 threads, chunks of 256 rows
 * at least, groups of 2048 rows at least: GPT-2's 768-wide sums over 16384
 * rows were 192 blocks (chunks of 1024), under two blocks an SM of 132 with
 * one vector step a warp in flight; now 768, about the SMs' resident blocks
 * at 40-48 registers. */
enum { CU_COL_TARGET_BLOCKS = 1024, CU_COL_MIN_CHUNK = 256, CU_COL_MIN_GROUP = 2048 };
static int64_t col_split(const Nest *N, int64_t nrow, int64_t ngrp, int maxl, int colrows) {
  if (maxl != 1) return 1;
  for (int i = 0; i < N->nst; i++)
    if (N->st[i].full && N->x[N->st[i].x].level > 0) return 1;
  int64_t blocks = (nrow + colrows - 1) / colrows;
  if (blocks >= CU_COL_TARGET_BLOCKS / 2 || ngrp < CU_COL_MIN_GROUP) return 1;
  int64_t s = (CU_COL_TARGET_BLOCKS + blocks - 1) / blocks, most = ngrp / CU_COL_MIN_CHUNK;
  if (s > most) s = most;
  if (s * blocks > CU_MAX_GRID) s = CU_MAX_GRID / blocks;
  return s >= 2 ? s : 1;
}

/* A column kernel's rows a block: CU_COL_ROWS16 where it loads or stores a
 * 16-bit value (16 of them fill a 32-byte sector), else CU_COL_ROWS. */
static int col_rows(const Nest *N) {
  for (int i = 0; i < N->nx; i++)
    if (N->x[i].kind == X_LOAD && (N->x[i].dt == DT_BF16 || N->x[i].dt == DT_F16)) return CU_COL_ROWS16;
  for (int i = 0; i < N->nst; i++)
    if (N->st[i].dt == DT_BF16 || N->st[i].dt == DT_F16) return CU_COL_ROWS16;
  return CU_COL_ROWS;
}

/* Marks the expressions a sweep computes from xi (a reduction of an earlier
 * level is the row's value: read, not computed again). */
static void sweep_reach(const Nest *N, int xi, char *mark) {
  if (xi < 0 || mark[xi]) return;
  mark[xi] = 1;
  if (N->x[xi].kind == X_RED) return;
  sweep_reach(N, N->x[xi].a, mark);
  sweep_reach(N, N->x[xi].b, mark);
}

/* A warp's row in registers (a wrow kernel's vector path): LayerNorm reads
 * its row in each of three sweeps (the mean, the variance, the outputs), and
 * rolled sweeps read it again from the L1 with one vector load in flight a
 * lane at a time. Where the vector loads of the row's own values (a row
 * axis in the address: not a weight, the same for every row) that two or
 * more sweeps read fit CU_WROW_CACHE_REGS registers a lane, the first sweep
 * keeps them in c<x>_[it_] and the later ones read those: each value is
 * loaded once, and a sweep's steps, unrolled whole, have all their loads in
 * flight together. Returns the per-expression marks (1: keep) or NULL. */
enum { CU_WROW_CACHE_REGS = 64 };
static char *row_cache(const Nest *N, int64_t ngrp, int maxl, int64_t *nit) {
  *nit = (ngrp + 127) / 128;
  char *keep = xalloc_calloc((size_t)N->nx + 1, 1), *mark = xalloc_calloc((size_t)N->nx + 1, 1);
  int *sweeps = xalloc_calloc((size_t)N->nx + 1, sizeof(int));
  for (int L = 1; L <= maxl + 1; L++) { /* each level's sweep, then the full outputs' */
    memset(mark, 0, (size_t)N->nx + 1);
    if (L <= maxl) {
      for (int i = 0; i < N->nx; i++)
        if (N->x[i].kind == X_RED && N->x[i].level == L) sweep_reach(N, N->x[i].a, mark);
    } else {
      for (int i = 0; i < N->nst; i++)
        if (N->st[i].full && N->x[N->st[i].x].kind != X_RED) sweep_reach(N, N->st[i].x, mark);
    }
    for (int i = 0; i < N->nx; i++) sweeps[i] += mark[i];
  }
  int64_t regs = 0;
  for (int i = 0; i < N->nx; i++) {
    const NestX *x = &N->x[i];
    if (x->kind != X_LOAD || sweeps[i] < 2 || !cu_vec_type(x->dt) || !vec_access(N, &x->off)) continue;
    int own = 0; /* the address walks a row axis */
    for (int j = 0; j < N->R; j++) own |= x->off.coef[j] != 0 && N->axis_of[j] >= 0 && N->aset[N->axis_of[j]] != 1;
    if (x->off.dax >= 0 && x->off.dcoef && N->axis_of[x->off.dax] >= 0 && N->aset[N->axis_of[x->off.dax]] != 1) own = 1;
    if (!own) continue;
    keep[i] = 1;
    regs += *nit * (x->dt == DT_F32 ? 4 : 2);
  }
  free(mark);
  free(sweeps);
  if (regs == 0 || regs > CU_WROW_CACHE_REGS) { /* none kept, or too many */
    free(keep);
    return NULL;
  }
  return keep;
}

/* A nest as one kernel: returns 0, or -1 after cu_fail. */
static int emit_nest(CuKern *k, Nest *N, const char *name, int step) {
  CgTarget *t = k->t;
  nest_collapse(N);
  CuText *o = &t->src;
  int row = has_red(N);
  Emit E = {k, N, o, xalloc_calloc((size_t)N->nx * 4 + 4, sizeof(int)), 0, -1, 0, row, "    ", 0, 0,
            xalloc_calloc((size_t)N->nx + 1, sizeof(int)), 0, 1, 0, 0, 0, 0, NULL};
  for (int i = 0; i < N->nx * 4; i++) E.scope_of[i] = -1;
  for (int i = 0; i < N->nx; i++) E.qdone[i] = -1;
  int rc = 0;
  int64_t nrow = row ? space(N, 0) : 0, ngrp = row ? space(N, 1) : 0;
  int maxl = 0, nred = 0;
  for (int i = 0; i < N->nx; i++)
    if (N->x[i].kind == X_RED) {
      nred++;
      if (N->x[i].level > maxl) maxl = N->x[i].level;
    }
  int col = row && N->na > 0 && N->aset[N->na - 1] != 1 && nrow > 1;
  int colrows = col_rows(N);
  /* col4: four neighbouring outputs a thread where every access along the
   * innermost axis can be a vector (vectorizable(N, 2)), cw threads across
   * a block's 4 cw outputs, so that a warp's loads of one row of the group
   * are 128 contiguous bytes, float4 (fp32) or uint2 (16-bit) a thread,
   * where the one-output kernel's were 32 bytes a row and 4 or 2 a thread.
   * The group is sliced as there (cny_ slices), so each output's sum is
   * added in the same order. */
  int col4 = col && vectorizable(N, 2);
  int cw = col4 ? (colrows == CU_COL_ROWS16 ? 16 : 8) : colrows, per_blk = col4 ? cw * 4 : colrows;
  int64_t nblk = (nrow + per_blk - 1) / per_blk, chunk = 0;
  E.split = col ? col_split(N, nrow, ngrp, maxl, per_blk) : 1;
  if (E.split > 1) {
    chunk = (ngrp + E.split - 1) / E.split;
    E.split = (ngrp + chunk - 1) / chunk; /* no empty chunk */
    cu_tx(o, "static __device__ float %s_part[%" PRId64 "];\nstatic __device__ unsigned %s_count[%" PRId64 "];\n", name,
          E.split * nred * nrow, name, nblk);
  }
  /* a short row a warp (E.wrow below): four blocks an SM at least, which
   * lets ptxas the registers it needs (without it, it spilled aiming at
   * more); two where its sweeps are vectors (below) */
  int wrow = row && !col && ngrp <= CU_WROW_MAX;
  /* the kernel's vector path: a loop's, a column kernel's (col4), a row's sweeps */
  int vec = !row ? vectorizable(N, 0) : col ? col4 : vectorizable(N, 1);
  int wrow4 = wrow && vec;
  if (wrow4) E.rcache = row_cache(N, ngrp, maxl, &E.rc_nit);
  /* a warp's row with vector sweeps, kept in registers or unrolled by four:
   * two blocks an SM, 128 registers a thread (at three, 80, ptxas spilled
   * GPT-2's fp32 final LayerNorm, 24 kept, and its bf16 residual add +
   * LayerNorm, 36; at four gpt's 2304-wide fp32 LayerNorm gradient unrolled);
   * sixteen warps an SM, each with all of its row's loads in flight (GPT-2's:
   * 6 steps x 24 bytes a lane) or four steps'. A column kernel: four blocks an
   * SM at least (64 registers), where ptxas spilled split ones aiming at six */
  cu_signature_min(k, o, name, col ? 4 : !wrow ? 0 : wrow4 ? 2 : 4);
  drop_bases(&E);
  if (!row) {
    int64_t n = space(N, -1);
    int64_t threads = vec ? n / 4 : n;
    if (vec) {
      /* four points a thread through float4 loads and stores when every
       * vector access is 16-byte aligned; else the scalar loop below */
      if_aligned(k, o, "  ");
      cu_tx(o, "    for (long long lin = (long long)blockIdx.x * blockDim.x + threadIdx.x; lin < %" PRId64
               "LL; lin += (long long)gridDim.x * blockDim.x) {\n",
            n / 4);
      decompose(o, N, -1, "lin * 4LL", "      ");
      E.scope = 1;
      E.in_sweep = 1;
      E.ind = "      ";
      rc = vec_stores(&E, 0);
      cu_tx(o, "    }\n    return;\n  }\n");
      E.ind = "    ";
    }
    /* a loop: one point per thread, grid-stride */
    cu_tx(o, "  for (long long lin = (long long)blockIdx.x * blockDim.x + threadIdx.x; lin < %" PRId64
          "LL; lin += (long long)gridDim.x * blockDim.x) {\n",
       n);
    decompose(o, N, -1, "lin", "    ");
    E.scope = 2;
    E.in_sweep = 1;
    if (!rc) rc = stores(&E, 1);
    if (!rc) rc = stores(&E, 0);
    cu_tx(o, "  }\n}\n\n");
    free(E.scope_of);
    free(E.qdone);
    /* the launch suits the vector path; the scalar one strides over the rest */
    cu_add_launch(k, name, step, vec ? "loop4" : "loop", (threads + CU_BLOCK - 1) / CU_BLOCK, CU_BLOCK);
    return rc;
  }
  /* a row kernel: a block per row, threads over the group, one sweep per
   * level. When the innermost axis is not the group's (a sum over leading
   * axes: a bias's gradient, a weight's over the batch) in columns instead:
   * a block holds colrows neighbouring rows (col_rows) (thread % rows) and its
   * threads' slices (thread / rows) split the group, so a warp reads whole
   * sectors; the slices' partial values meet in shared memory, added in
   * slice order (hpdl_col_sum), no shuffles. */
  E.col = col;
  E.col4 = col4;
  /* a short row (LayerNorm's 768 values) a warp: eight rows a block in
   * flight where one row and its block-wide reductions (two barriers each)
   * left the SM waiting on one row's loads at a time */
  E.wrow = wrow;
  cu_tx(o, col ? "  __shared__ float red_[%d];\n" : "  __shared__ float red_[32];\n", CU_BLOCK);
  if (vec) { /* four points of the group a thread through float4, when aligned */
    cu_tx(o, "  bool vec_ = false;\n");
    if_aligned(k, o, "  ");
    cu_tx(o, "    vec_ = true;\n  }\n");
  }
  if (E.split > 1) { /* a block per (column block, chunk of the group) */
    cu_tx(o, "  __shared__ bool last_;\n");
    cu_tx(o, "  const int cy_ = (int)(threadIdx.x / %d), cny_ = (int)(blockDim.x / %d);\n", cw, cw);
    cu_tx(o, "  const long long cb_ = (long long)blockIdx.x %% %" PRId64 "LL, sp_ = (long long)blockIdx.x / %" PRId64 "LL;\n", nblk,
          nblk);
    cu_tx(o, "  const long long glo_ = sp_ * %" PRId64 "LL, ghi_ = glo_ + %" PRId64 "LL < %" PRId64 "LL ? glo_ + %" PRId64 "LL : %" PRId64
             "LL;\n",
          chunk, chunk, ngrp, chunk, ngrp);
    cu_tx(o, "  {\n    const long long row0 = cb_ * %dLL;\n", per_blk);
    cu_tx(o, "    const long long row = row0 + (threadIdx.x %% %d)%s;\n    const bool live_ = row < %" PRId64 "LL;\n", cw,
          col4 ? " * 4LL" : "", nrow);
  } else if (col) {
    cu_tx(o, "  const int cy_ = (int)(threadIdx.x / %d), cny_ = (int)(blockDim.x / %d);\n", cw, cw);
    cu_tx(o, "  for (long long row0 = (long long)blockIdx.x * %dLL; row0 < %" PRId64 "LL; row0 += (long long)gridDim.x * %dLL) {\n",
          per_blk, nrow, per_blk);
    cu_tx(o, "    const long long row = row0 + (threadIdx.x %% %d)%s;\n    const bool live_ = row < %" PRId64 "LL;\n", cw,
          col4 ? " * 4LL" : "", nrow);
  } else if (E.wrow) { /* CU_WROW_ROWS rows a block, a warp each */
    cu_tx(o, "  const int lane_ = (int)(threadIdx.x & 31);\n");
    if (nrow <= 0x7fffffffLL - (int64_t)CU_MAX_GRID * CU_WROW_ROWS)
      cu_tx(o, "  for (int row = (int)(blockIdx.x * %du + (threadIdx.x >> 5)); row < %" PRId64 "; row += (int)(gridDim.x * %du)) {\n",
            CU_WROW_ROWS, nrow, CU_WROW_ROWS);
    else
      cu_tx(o, "  for (long long row = (long long)blockIdx.x * %dLL + (threadIdx.x >> 5); row < %" PRId64
               "LL; row += (long long)gridDim.x * %dLL) {\n",
            CU_WROW_ROWS, nrow, CU_WROW_ROWS);
  } else
    cu_tx(o, "  for (long long row = blockIdx.x; row < %" PRId64 "LL; row += gridDim.x) {\n", nrow);
  decompose(o, N, 0, "row", "    ");
  for (int i = 0; E.rcache && i < N->nx; i++)
    if (E.rcache[i]) cu_tx(o, "    %s c%d_[%" PRId64 "];\n", N->x[i].dt == DT_F32 ? "float4" : "uint2", i, E.rc_nit);
  int sweep = 1;
  E.row_scope = 0;
  E.scope = 0;
  /* A column kernel whose full outputs read no reduced value (GELU's
   * backward beside its bias sum) stores them in the sweep that sums: one
   * pass over memory instead of a second that reads it all again. */
  int early_full = col && maxl == 1;
  for (int i = 0; i < N->nst && early_full; i++)
    if (N->st[i].full && N->x[N->st[i].x].level > 0) early_full = 0;
  for (int L = 1; L <= maxl && !rc; L++) {
    for (int i = 0; i < N->nx; i++)
      if (N->x[i].kind == X_RED && N->x[i].level == L) {
        if (!col4) cu_tx(o, "    float acc%d = %s;\n", i, N->x[i].redmax ? "HPDL_NEG_INF" : "0.0f");
        for (int l = 0; col4 && l < 4; l++) cu_tx(o, "    float acc%d_%d = %s;\n", i, l, N->x[i].redmax ? "HPDL_NEG_INF" : "0.0f");
      }
    for (int pass = vec ? 0 : 1; pass < 2 && !rc; pass++) {
      int v4 = pass == 0;
      sweep_open(&E, vec, v4, ngrp, &sweep);
      E.vec = v4 || col4; /* col4's lanes in both passes: vectors, else one value at a time */
      E.lscalar = col4 && !v4;
      for (E.lane = 0; E.lane < (E.vec ? 4 : 1) && !rc; E.lane++)
        for (int i = 0; i < N->nx && !rc; i++) {
          NestX *x = &N->x[i];
          if (x->kind != X_RED || x->level != L) continue;
          rc = ex(&E, x->a);
          if (rc) break;
          char c[24], acc[24];
          vname(&E, x->a, c, sizeof c);
          if (col4) snprintf(acc, sizeof acc, "acc%d_%d", i, E.lane);
          else snprintf(acc, sizeof acc, "acc%d", i);
          if (x->redmax) cu_tx(o, "      %s = fmaxf(%s, %s);\n", acc, acc, c);
          else cu_tx(o, "      %s += %s;\n", acc, c);
        }
      E.lane = 0; /* (the loop left it past the last lane) */
      if (early_full && !rc) rc = !col4 ? stores(&E, 1) : v4 ? vec_stores(&E, 1) : lane_stores(&E, 1);
      E.vec = 0;
      E.lscalar = 0;
      E.lane = 0;
      cu_tx(o, "    }\n");
    }
    if (vec) cu_tx(o, "    }\n");
    E.ind = "    ";
    E.in_sweep = 0;
    E.scope = 0;
    for (int i = 0; i < N->nx; i++) {
      NestX *x = &N->x[i];
      if (x->kind != X_RED || x->level != L) continue;
      if (E.split > 1) { /* this chunk's part; the total is the last block's */
        if (!col4) cu_tx(o, "    const float s%d_ = hpdl_col_%s(acc%d, red_, %d);\n", i, x->redmax ? "max" : "sum", i, cw);
        for (int l = 0; col4 && l < 4; l++)
          cu_tx(o, "    const float s%d_%d_ = hpdl_col_%s(acc%d_%d, red_, %d);\n", i, l, x->redmax ? "max" : "sum", i, l, cw);
        continue;
      }
      if (col4) { /* each lane's output */
        for (int l = 0; l < 4; l++) {
          cu_tx(o, "    const float v%d_%d = hpdl_col_%s(acc%d_%d, red_, %d)", i, l, x->redmax ? "max" : "sum", i, l, cw);
          if (x->div) cu_tx(o, " / %" PRId64 ".0f", x->div);
          cu_tx(o, ";\n");
          E.scope_of[i * 4 + l] = 0;
        }
        continue;
      }
      if (col) cu_tx(o, "    const float v%d = hpdl_col_%s(acc%d, red_, %d)", i, x->redmax ? "max" : "sum", i, colrows);
      else if (E.wrow) cu_tx(o, "    const float v%d = hpdl_warp_%s(acc%d)", i, x->redmax ? "max" : "sum", i);
      else cu_tx(o, "    const float v%d = hpdl_block_%s(acc%d, red_)", i, x->redmax ? "max" : "sum", i);
      if (x->div) cu_tx(o, " / %" PRId64 ".0f", x->div);
      cu_tx(o, ";\n");
      for (int l = 0; l < 4; l++) E.scope_of[i * 4 + l] = 0; /* every lane reads the row's value */
    }
  }
  if (!rc) {
    /* the last sweep: the full outputs (stored above when early_full) */
    for (int pass = vec ? 0 : 1; pass < 2 && !rc && !early_full; pass++) {
      int v4 = pass == 0;
      sweep_open(&E, vec, v4, ngrp, &sweep);
      rc = v4 ? vec_stores(&E, 1) : col4 ? lane_stores(&E, 1) : stores(&E, 1);
      cu_tx(o, "    }\n");
    }
    if (vec && !early_full) cu_tx(o, "    }\n");
    /* row-level outputs (a mean, a norm's statistics): once per row */
    E.ind = "      ";
    E.scope = ++sweep;
    E.in_sweep = 0;
    if (E.split > 1 && !rc) {
      /* the partials out; the last block of the column block adds them in chunk order */
      cu_tx(o, "    if (cy_ == 0 && live_) {\n");
      for (int i = 0, j = 0; i < N->nx; i++)
        if (N->x[i].kind == X_RED) {
          if (!col4) cu_tx(o, "      %s_part[(sp_ * %dLL + %dLL) * %" PRId64 "LL + row] = s%d_;\n", name, nred, j, nrow, i);
          for (int l = 0; col4 && l < 4; l++)
            cu_tx(o, "      %s_part[(sp_ * %dLL + %dLL) * %" PRId64 "LL + row + %d] = s%d_%d_;\n", name, nred, j, nrow, l, i, l);
          j++;
        }
      cu_tx(o, "    }\n    __threadfence();\n    __syncthreads();\n");
      cu_tx(o, "    if (threadIdx.x == 0) last_ = atomicAdd(&%s_count[cb_], 1u) == %" PRId64 "u;\n", name, E.split - 1);
      cu_tx(o, "    __syncthreads();\n    if (!last_) return;\n    __threadfence();\n");
      /* the last block adds the chunks' parts with all of its slices: slice y
       * the chunks y, y + cny_, ... (four loads in flight, from the L2:
       * __ldcg), then the slices in order (hpdl_col_sum), the same order every
       * run; one thread adding every chunk in turn waited an L2 round trip a
       * chunk and output. One output at a time: all of a col4 kernel's in
       * one loop spilled (gpt's fp32 LayerNorm gradient on sm_80) */
      int nl = col4 ? 4 : 1;
      for (int i = 0, j = 0; i < N->nx; i++) {
        NestX *x = &N->x[i];
        if (x->kind != X_RED) continue;
        for (int l = 0; l < nl; l++) {
          char v[24], at[24] = "";
          if (col4) snprintf(v, sizeof v, "v%d_%d", i, l), snprintf(at, sizeof at, " + %d", l);
          else snprintf(v, sizeof v, "v%d", i);
          cu_tx(o, "    float t%d_%d_ = %s;\n", i, l, x->redmax ? "HPDL_NEG_INF" : "0.0f");
          cu_tx(o, "    if (live_) {\n      HPDL_UNROLL4\n      for (long long c_ = cy_; c_ < %" PRId64 "LL; c_ += cny_) {\n", E.split);
          cu_tx(o, "        const float q_ = __ldcg(&%s_part[(c_ * %dLL + %dLL) * %" PRId64 "LL + row%s]);\n", name, nred, j, nrow, at);
          if (x->redmax) cu_tx(o, "        t%d_%d_ = fmaxf(t%d_%d_, q_);\n", i, l, i, l);
          else cu_tx(o, "        t%d_%d_ += q_;\n", i, l);
          cu_tx(o, "      }\n    }\n");
          cu_tx(o, "    const float %s = hpdl_col_%s(t%d_%d_, red_, %d)", v, x->redmax ? "max" : "sum", i, l, cw);
          if (x->div) cu_tx(o, " / %" PRId64 ".0f", x->div);
          cu_tx(o, ";\n");
        }
        j++;
        for (int l = 0; l < 4; l++) E.scope_of[i * 4 + l] = E.scope;
      }
      cu_tx(o, "    if (cy_ == 0 && live_) {\n");
      rc = col4 ? lane_stores(&E, 0) : stores(&E, 0);
      cu_tx(o, "    }\n    if (threadIdx.x == 0) %s_count[cb_] = 0u; /* for the next launch */\n", name);
    } else {
      cu_tx(o, col ? "    if (cy_ == 0 && live_) {\n" : E.wrow ? "    if (lane_ == 0) {\n" : "    if (threadIdx.x == 0) {\n");
      if (!rc) rc = col4 ? lane_stores(&E, 0) : stores(&E, 0);
      cu_tx(o, "    }\n");
    }
  }
  cu_tx(o, "  }\n}\n\n");
  free(E.scope_of);
  free(E.qdone);
  free(E.rcache);
  if (col) { /* per_blk rows a block; up to CU_BLOCK / cw slices of the group, whole warps */
    int64_t threads = ngrp * cw < CU_BLOCK ? ngrp * cw : CU_BLOCK;
    threads = (threads + 31) / 32 * 32;
    int64_t blocks = nblk * E.split;
    cu_add_launch(k, name, step, col4 ? "col4" : "col", blocks < CU_MAX_GRID ? blocks : CU_MAX_GRID, threads);
    return rc;
  }
  if (E.wrow) { /* CU_WROW_ROWS warps a block, a row each */
    int64_t blocks = (nrow + CU_WROW_ROWS - 1) / CU_WROW_ROWS;
    cu_add_launch(k, name, step, vec ? "wrow4" : "wrow", blocks < CU_MAX_GRID ? blocks : CU_MAX_GRID, 32 * CU_WROW_ROWS);
    return rc;
  }
  /* a warp per 32 elements of the row (128 with float4), at most CU_BLOCK threads */
  int64_t per = vec ? ngrp / 4 : ngrp;
  int64_t block = per >= CU_BLOCK ? CU_BLOCK : (per + 31) / 32 * 32;
  cu_add_launch(k, name, step, vec ? "row4" : "row", nrow, block);
  return rc;
}

static int emit_zero(CuKern *k, int v, const char *name, int step) {
  CuText *o = &k->t->src;
  cu_signature(k, o, name);
  int io = cu_io_index(k, v);
  if (io < 0) {
    cu_fail(k->t, "graph %s kernel k%d: %%%d is not an output of the kernel", k->fg->graph->name, k->kp, v);
    return -1;
  }
  cu_tx(o, "  for (long long lin = (long long)blockIdx.x * blockDim.x + threadIdx.x; lin < %" PRId64
        "LL; lin += (long long)gridDim.x * blockDim.x) p%d[lin] = 0;\n}\n\n",
     ir_numel(nd(k, v)), io);
  cu_add_launch(k, name, step, "zero", (ir_numel(nd(k, v)) + CU_BLOCK - 1) / CU_BLOCK, CU_BLOCK);
  return 0;
}

/* A GEMM kernel: recorded for cuBLASLt (the runtime's host program makes
 * the call; nothing is generated for the product), and its epilogue (bias,
 * activation, ...) generated as a loop over the output. */
/* The epilogue cuBLASLt runs itself: the product (scaled) plus a bias
 * broadcast over the rows, then optionally relu or gelu (the tanh form, as
 * the IR's and CUBLASLT_EPILOGUE_GELU), with nothing else after the
 * product. *d: the value the call writes (D), *aux: the pre-activation when
 * a later kernel reads it too (the AUX epilogues), else -1. 0 when the
 * epilogue is not one of these and must be generated. A lone cast of the
 * product to bf16 (FUSE_EPI_CAST) is cuBLASLt's too: a bf16 D, *kind NULL. */
static int lt_epilogue(const CuKern *k, const GemmPlan *P, const char **kind, int *bias, int *d, int *aux) {
  const FuseKernel *K = k->K;
  const IrGraph *g = k->fg->graph;
  int add = -1, act = -1;
  if (K->epilogue == FUSE_EPI_CAST) { /* the bare product into a bf16 D (fuse.c's store16) */
    for (int j = 0; j < K->nnodes; j++) {
      int id = K->nodes[j];
      if (id > P->product && g->nodes[id].op == IR_CAST && g->nodes[id].dtype == DT_BF16 && g->nodes[id].in[0] == P->product &&
          cu_io_index(k, P->product) < 0 && cu_io_index(k, id) >= K->ninputs) {
        *kind = NULL;
        *bias = *aux = -1;
        *d = id;
        return 1;
      }
    }
    return 0;
  }
  for (int j = 0; j < K->nnodes; j++) {
    int id = K->nodes[j];
    const IrNode *n = &g->nodes[id];
    if (id <= P->product || n->op == IR_RESHAPE) continue;
    if (add < 0 && n->op == IR_ADD && (n->in[0] == P->product || n->in[1] == P->product)) add = id;
    else if (add >= 0 && act < 0 && (n->op == IR_RELU || n->op == IR_GELU) && n->in[0] == add) act = id;
    else return 0;
  }
  if (add < 0 || cu_io_index(k, P->product) >= 0) return 0; /* the bare product is read elsewhere */
  const IrNode *an = &g->nodes[add];
  int b = an->in[0] == P->product ? an->in[1] : an->in[0];
  const IrNode *bn = &g->nodes[b];
  if (bn->dtype != DT_F32 || cu_io_index(k, b) < 0 || cu_io_index(k, b) >= K->ninputs || bn->rank < 1 ||
      bn->dims[bn->rank - 1] != P->N)
    return 0;
  for (int i = 0; i + 1 < bn->rank; i++)
    if (bn->dims[i] != 1) return 0;
  if (an->rank != g->nodes[P->matmul].rank) return 0;
  *bias = b;
  *d = act >= 0 ? act : add;
  *aux = act >= 0 && cu_io_index(k, add) >= 0 ? add : -1;
  *kind = act < 0 ? "bias" : g->nodes[act].op == IR_RELU ? "bias_relu" : "bias_gelu";
  return cu_io_index(k, *d) >= K->ninputs;
}

static void gemm(CuKern *k) {
  CgTarget *t = k->t;
  GemmPlan P;
  if (gemm_plan(&k->nk, &P)) return;
  const char *epi = NULL;
  int ebias = -1, ed = -1, eaux = -1;
  int d16 = 0; /* a bf16 D with no epilogue */
  if (P.epilogue && lt_epilogue(k, &P, &epi, &ebias, &ed, &eaux)) {
    P.out = ed;
    d16 = !epi;
  } else
    epi = NULL;
  if (P.bgrad >= 0) { /* fuse.h's rule 8: cuBLASLt sums the operand as it reads it */
    epi = P.bgrad_side ? "bgrad_b" : "bgrad_a";
    ebias = P.bgrad;
  }
  int64_t sa[IR_MAX_RANK], sb[IR_MAX_RANK];
  gemm_batch_strides(&P, &P.a, sa);
  gemm_batch_strides(&P, &P.b, sb);
  /* One stride per operand over the flattened batch when its batch axes
   * walk memory evenly (cuBLASLt's strided batch); else -1, and the host
   * loops over the matrices with the per-axis strides (as the CPU does). */
  const IrNode *mmn = &k->fg->graph->nodes[P.matmul];
  int64_t nb = P.flat ? 1 : P.nbatch, ma = 0, mb = 0;
  for (int w = 0; w < 2; w++) {
    const int64_t *st = w ? sb : sa;
    int64_t stride = 0, inner = 1;
    int even = 1, set = 0;
    for (int i = P.batch_axes - 1; i >= 0; i--) {
      int64_t d = mmn->dims[i];
      if (d > 1) {
        if (!set) {
          stride = st[i] / inner;
          set = 1;
        }
        if (st[i] != stride * inner) even = 0;
      }
      inner *= d;
    }
    if (w) mb = even ? stride : -1;
    else ma = even ? stride : -1;
  }
  char name[200];
  snprintf(name, sizeof name, "%s_gemm", k->base);
  cu_tx(&t->src, "/* %s: cuBLASLt C[%" PRId64 ", %" PRId64 "] = %g op(A) op(B), K %" PRId64 ", transa %d transb %d, %" PRId64
                 " matri%s%s%s */\n\n",
        name, P.flat ? P.nbatch * P.M : P.M, P.N, P.alpha, P.K, P.a.trans, P.b.trans, nb, nb == 1 ? "x" : "ces",
        epi ? ", epilogue " : "", epi ? epi : "");
  cu_add_launch(k, name, 0, "gemm", 0, 0);
  CuLaunch *l = &t->launch[t->nlaunch - 1];
  t->stats.kernels--; /* not a kernel of ours */
  l->grid = l->block = 0;
  l->gemm_a = cu_io_index(k, P.a.mem);
  l->gemm_b = cu_io_index(k, P.b.mem);
  l->gemm_c = cu_io_index(k, P.out);
  l->trans_a = P.a.trans;
  l->trans_b = P.b.trans;
  l->ab_bf16 = k->fg->graph->nodes[P.a.mem].dtype == DT_BF16;
  l->c_bf16 = k->fg->graph->nodes[P.out].dtype == DT_BF16;
  if (l->c_bf16 && !epi && !d16) { /* fuse.c ends a GEMM with a 16-bit store only where cuBLASLt makes it */
    cu_fail(t, "%s: a GEMM writing bf16 without a bias epilogue (a bug of the fusion)", name);
    return;
  }
  l->m = P.flat ? P.nbatch * P.M : P.M;
  l->n = P.N;
  l->k = P.K;
  l->lda = P.a.cols;
  l->ldb = P.b.cols;
  l->ldc = P.N;
  l->alpha = P.alpha;
  l->batch = nb;
  l->stride_a = nb > 1 ? (ma < 0 ? -1 : ma * P.a.rows * P.a.cols) : 0;
  l->stride_b = nb > 1 ? (mb < 0 ? -1 : mb * P.b.rows * P.b.cols) : 0;
  l->stride_c = nb > 1 ? P.M * P.N : 0;
  l->batch_axes = P.flat ? 0 : P.batch_axes;
  for (int i = 0; i < l->batch_axes; i++) {
    l->bdims[i] = mmn->dims[i];
    l->sa[i] = sa[i];
    l->sb[i] = sb[i];
  }
  l->amat = P.a.rows * P.a.cols;
  l->bmat = P.b.rows * P.b.cols;
  l->epilogue = epi;
  l->bias = epi ? cu_io_index(k, ebias) : -1;
  l->aux = epi && eaux >= 0 ? cu_io_index(k, eaux) : -1;
  t->ngemm++;
  if (t->opt.emulate) {
    const IrNode *mn = &k->fg->graph->nodes[P.matmul];
    CuText *o = &k->stub;
    cu_tx(o, "  {\n    static const long long bd[] = {");
    for (int i = 0; i < P.batch_axes; i++) cu_tx(o, "%" PRId64 ", ", mn->dims[i]);
    cu_tx(o, "1}, sa[] = {");
    for (int i = 0; i < P.batch_axes; i++) cu_tx(o, "%" PRId64 ", ", sa[i]);
    cu_tx(o, "0}, sb[] = {");
    for (int i = 0; i < P.batch_axes; i++) cu_tx(o, "%" PRId64 ", ", sb[i]);
    /* a bf16 D: the product in fp32 first, rounded by the epilogue as it is written */
    char c_arg[48];
    snprintf(c_arg, sizeof c_arg, "(float *)io[%d]", l->gemm_c);
    cu_tx(o, "0};\n");
    if (l->c_bf16) {
      cu_tx(o, "    float *c32 = (float *)malloc(sizeof(float) * %" PRId64 ");\n    if (!c32) return 1;\n", P.nbatch * P.M * P.N);
      snprintf(c_arg, sizeof c_arg, "c32");
    }
    cu_tx(o, "    hpdl_emu_gemm(io[%d], io[%d], %d, %s, %d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
             ", %" PRId64 ", ",
          l->gemm_a, l->gemm_b, l->ab_bf16, c_arg, P.a.trans, P.b.trans, P.M, P.N, P.K, P.a.cols, P.b.cols);
    cu_float(o, P.alpha);
    cu_tx(o, ", %d, bd, sa, sb, %" PRId64 ", %" PRId64 ");\n", P.batch_axes, P.a.rows * P.a.cols, P.b.rows * P.b.cols);
    char aux_arg[32] = "nullptr";
    if (l->aux >= 0) snprintf(aux_arg, sizeof aux_arg, "(float *)io[%d]", l->aux);
    if (P.bgrad >= 0) /* the bias gradient: the stored [K, X] operand's rows summed */
      cu_tx(o, "    hpdl_emu_bgrad((float *)io[%d], io[%d], %d, %" PRId64 ", %" PRId64 ", %" PRId64 ");\n", l->bias,
            P.bgrad_side ? l->gemm_b : l->gemm_a, l->ab_bf16, P.K, P.bgrad_side ? P.N : P.M,
            P.bgrad_side ? P.b.cols : P.a.cols);
    else if (l->c_bf16) { /* the bias (if any) added in fp32, the sum rounded into D */
      char bias_arg[32] = "nullptr";
      if (!d16) snprintf(bias_arg, sizeof bias_arg, "(const float *)io[%d]", l->bias);
      cu_tx(o, "    hpdl_emu_bias16((unsigned short *)io[%d], c32, %s, %" PRId64 ", %" PRId64 ");\n    free(c32);\n", l->gemm_c,
            bias_arg, P.nbatch * P.M, P.N);
    }
    else if (epi) /* what cuBLASLt's epilogue does after the product */
      cu_tx(o, "    hpdl_emu_epilogue((float *)io[%d], (const float *)io[%d], %s, %" PRId64 ", %" PRId64 ", %d);\n",
            l->gemm_c, l->bias, aux_arg, P.nbatch * P.M, P.N,
            !strcmp(epi, "bias") ? 0 : !strcmp(epi, "bias_relu") ? 1 : 2);
    cu_tx(o, "  }\n");
  }
  if (epi || d16) return; /* cuBLASLt's */
  if (P.epilogue) {
    Nest N;
    gemm_epilogue(&k->nk, &P, &N);
    snprintf(name, sizeof name, "%s_epi", k->base);
    emit_nest(k, &N, name, 1);
    nest_free(&N);
  }
}

/* A comment before a fused kernel's code: its kind, its IR ops and the
 * .hpd lines they come from, so that a compile error in generated code (a
 * bug of ours) leads back to the model (error_context reads it). */
static void provenance(CuKern *k) {
  CgTarget *t = k->t;
  const FuseKernel *K = k->K;
  const IrGraph *g = k->fg->graph;
  cu_tx(&t->src, "/* %s: %s kernel %d of graph %s:", k->base, fuse_kind_name(K->kind), k->kp, g->name);
  int shown = 0;
  for (int j = 0; j < K->nnodes && shown < 12; j++) {
    const IrNode *n = &g->nodes[K->nodes[j]];
    if (n->op == IR_RESHAPE || n->op == IR_CONST) continue;
    cu_tx(&t->src, "%s %%%d %s", shown ? "," : "", K->nodes[j], ir_op_name(n->op));
    shown++;
  }
  if (shown == 12) cu_tx(&t->src, ", ...");
  /* distinct source lines, at most 3 */
  Span seen[3];
  int nseen = 0;
  for (int j = 0; j < K->nnodes && nseen < 3; j++) {
    Span sp = g->nodes[K->nodes[j]].span;
    if (sp.file < 0 || sp.line <= 0) continue;
    int dup = 0;
    for (int q = 0; q < nseen; q++) dup |= seen[q].file == sp.file && seen[q].line == sp.line;
    if (dup) continue;
    seen[nseen++] = sp;
    const char *path = t->opt.source_path ? t->opt.source_path(t->opt.source_ctx, sp.file) : NULL;
    const char *base = path && strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (base) cu_tx(&t->src, "%s %s:%d", nseen == 1 ? "; from" : ",", base, sp.line);
    else cu_tx(&t->src, "%s line %d", nseen == 1 ? "; from" : ",", sp.line);
  }
  cu_tx(&t->src, " */\n");
}

/* A kernel of one VOCAB_MASK (no tensor group) over a value of its own type
 * (fp32, bf16 or fp16) read directly (ir_vocab_mask_in_place): the host program runs it in place where
 * its input dies there (runtime/device/devexec.c's dead_values), so that the
 * padded logits take no second buffer; then it writes the fill into the
 * padded columns alone. Run over two buffers (the kernel tests) it is the
 * masked copy. The pointers are not restrict: they may be one. */
static int cu_vmask_in_place(const IrGraph *g, const FuseKernel *K) {
  return K->kind == FUSE_LOOP && K->ninputs == 1 && K->noutputs == 1 && ir_vocab_mask_in_place(g, K->inputs[0], K->outputs[0]);
}

static void vmask_in_place(CuKern *k) {
  CuText *o = &k->t->src;
  const IrNode *n = nd(k, k->K->outputs[0]);
  int64_t cols = n->dims[n->rank - 1], keep = n->attr[1], total = ir_numel(n), rows = total / cols;
  int64_t pad = cols > keep ? cols - keep : 0;
  const char *ty = cu_c_type(n->dtype); /* float, or a 16-bit type's bits */
  cu_tx(o, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const hpdl_kctx hpd, const %s *p0, %s *p1) {\n", CU_BLOCK,
        k->base, ty, ty);
  cu_tx(o, "  const long long stride = (long long)gridDim.x * blockDim.x, first = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n");
  cu_tx(o, "  const %s fill = ", ty);
  if (n->dtype != DT_F32) cu_tx(o, "hpdl_%s_from_f32(", n->dtype == DT_BF16 ? "bf16" : "f16");
  cu_float(o, n->fattr);
  cu_tx(o, "%s;\n", n->dtype != DT_F32 ? ")" : "");
  cu_tx(o, "  if ((const void *)p0 == (const void *)p1) { /* in place: the %" PRId64 " padded columns of %" PRId64 " rows */\n", pad,
        rows);
  cu_tx(o, "    for (long long lin = first; lin < %" PRId64 "LL; lin += stride)\n", rows * pad);
  cu_tx(o, "      p1[lin / %" PRId64 "LL * %" PRId64 "LL + %" PRId64 "LL + lin %% %" PRId64 "LL] = fill;\n", pad ? pad : 1, cols,
        keep, pad ? pad : 1);
  cu_tx(o, "    return;\n  }\n");
  cu_tx(o, "  for (long long lin = first; lin < %" PRId64 "LL; lin += stride)\n", total);
  cu_tx(o, "    p1[lin] = lin %% %" PRId64 "LL >= %" PRId64 "LL ? fill : p0[lin];\n}\n\n", cols, keep);
  cu_add_launch(k, k->base, 0, "loop", (total + CU_BLOCK - 1) / CU_BLOCK, CU_BLOCK);
}

static void kernel(CgTarget *t, int gi, int kp) {
  const FuseGraph *fg = &t->fr->graphs[gi];
  const FuseKernel *K = &fg->kernels[kp];
  CuKern k;
  memset(&k, 0, sizeof k);
  k.t = t;
  k.gi = gi;
  k.kp = kp;
  k.fg = fg;
  k.K = K;
  k.nk = (NestKernel){.g = fg->graph, .fg = fg, .K = K, .kp = kp, .backend = "CUDA", .dtype_ok = cu_dtype_ok,
                      .fail = nest_fail_cb, .be = &k};
  cu_kernel_base(fg, kp, k.base, sizeof k.base);
  if (K->kind != FUSE_VIEW && K->kind != FUSE_CALL && K->kind != FUSE_COMM && K->kind != FUSE_LEAF) provenance(&k);
  switch (K->kind) {
  case FUSE_LEAF: {
    /* the leaves that have code (the CPU back end's cg_kernel_has_code):
     * fills, iotas and constants that a kernel reads from memory */
    const IrNode *n = nd(&k, K->nodes[0]);
    if (n->op != IR_FILL && n->op != IR_IOTA && n->op != IR_CONST) return;
  } /* fall through */
  case FUSE_LOOP:
  case FUSE_ROW:
  case FUSE_COPY: {
    if (cu_vmask_in_place(fg->graph, K)) {
      vmask_in_place(&k);
      break;
    }
    NestSteps S;
    nest_build_steps(&S, &k.nk);
    for (int i = 0; i < S.n && !t->failed; i++) {
      char name[200];
      if (S.n == 1) snprintf(name, sizeof name, "%s", k.base);
      else snprintf(name, sizeof name, "%s_s%d", k.base, i);
      if (S.step[i].zero_value >= 0) emit_zero(&k, S.step[i].zero_value, name, i);
      else emit_nest(&k, &S.step[i].nest, name, i);
    }
    nest_free_steps(&S);
    break;
  }
  case FUSE_GEMM: gemm(&k); break;
  case FUSE_SPECIAL: cu_special(&k); break;
  default: break; /* views, collectives and calls are the host program's */
  }
  if (t->opt.emulate && k.stub.len) {
    cu_tx(&t->emu, "extern \"C\" int hpd_emu%s(const hpdl_kctx *ctx, void **io) {\n%s  return 0;\n}\n\n", k.base + 3, k.stub.s);
  }
  free(k.stub.s);
}

/* ---- the interface ---- */

static CgTarget *cu_create(const IrModule *m, const FuseResult *fr, const CgOptions *opt, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  CgTarget *t = xalloc_calloc(1, sizeof *t);
  t->m = m;
  t->fr = fr;
  if (opt) t->opt = *opt;
  return t;
}

/* How many values of kernel K's input or output `id` it moves: all of them, but for an
 * embedding table, of which a lookup reads one row an id (at most the table: a step's
 * tokens read 4096 of Llama's 32000 rows, not the 0.5 GB table) */
static int64_t gathered_numel(const IrGraph *g, const FuseKernel *K, int id, int input) {
  int64_t n = ir_numel(&g->nodes[id]);
  if (!input) return n;
  int64_t rows = 0;
  for (int i = 0; i < K->nnodes; i++) {
    const IrNode *e = &g->nodes[K->nodes[i]];
    for (int j = 0; j < e->nin; j++) {
      if (e->in[j] != id) continue;
      if (e->op != IR_EMBEDDING || j != 0 || e->nin < 2) return n; /* read whole by another op */
      rows += ir_numel(&g->nodes[e->in[1]]) * g->nodes[id].dims[g->nodes[id].rank - 1];
    }
  }
  return rows > 0 && rows < n ? rows : n;
}

/* The launches' bytes (codegen_cuda.h): each fused kernel of ours (no GEMM) moves at
 * least its inputs and outputs once: `bytes` where the kernel is one launch (a launch's
 * bandwidth), else `kernel_bytes` on its first step (the step's traffic, whichever step
 * moves it), but for the kernels whose other steps compute (attention's backward). */
static void launch_bytes(CgTarget *t) {
  for (int i = 0; i < t->nlaunch; i++) {
    CuLaunch *l = &t->launch[i];
    l->bytes = l->kernel_bytes = 0;
    if (!strcmp(l->kind, "gemm") || !strcmp(l->kind, "grouped") || !strcmp(l->kind, "host")) continue;
    int alone = 1, first = 1, compute = 0; /* compute: a step on tensor cores (attention, conv) */
    for (int j = 0; j < t->nlaunch; j++)
      if (j != i && t->launch[j].graph == l->graph && t->launch[j].kernel == l->kernel) {
        alone = 0;
        first &= j > i;
        compute |= t->launch[j].flops > 0;
      }
    if (!alone && (!first || compute)) continue;
    const FuseGraph *fg = &t->fr->graphs[l->graph];
    const FuseKernel *K = &fg->kernels[l->kernel];
    double b = 0;
    if (cu_vmask_in_place(fg->graph, K)) { /* the padded columns alone, as the host program runs it where it can */
      const IrNode *x = &fg->graph->nodes[K->outputs[0]];
      int64_t cols = x->dims[x->rank - 1], pad = cols > x->attr[1] ? cols - x->attr[1] : 0;
      l->bytes = (double)(ir_numel(x) / cols * pad) * (double)sem_dtype_bytes(x->dtype);
      continue;
    }
    for (int v = 0; v < K->ninputs + K->noutputs; v++) {
      int id = v < K->ninputs ? K->inputs[v] : K->outputs[v - K->ninputs];
      const IrNode *x = &fg->graph->nodes[id];
      b += (double)gathered_numel(fg->graph, K, id, v < K->ninputs) * (double)sem_dtype_bytes(x->dtype);
    }
    if (alone) l->bytes = b;
    else l->kernel_bytes = b;
  }
}

static int cu_generate(CgTarget *t) {
  cu_tx(&t->src,
     "/* generated by hpdlc: the CUDA kernels of one module (compiler/codegen/codegen_cuda.c).\n"
     " * Each kernel: (hpdl_kctx, then a pointer per input and output); launch with\n"
     " * %d threads a block; a loop kernel is grid-stride, a row kernel takes a block per row. */\n"
     "%s"
     "#include \"hpdl_cuda.cuh\"\n"
     "#include \"hpdl_attention.cuh\" /* flash attention */\n"
     "#include \"hpdl_conv.cuh\" /* convolution and pooling */\n"
     "#include \"hpdl_lmce.cuh\" /* the fused head and cross-entropy */\n"
     "#include \"hpdl_moe.cuh\" /* the mixture of experts' routing table */\n"
     "#include \"hpdl_optim.cuh\" /* the optimizer and the gradient norm, for the runtime */\n\n",
     CU_BLOCK, t->opt.moments16 ? "#define HPDL_OPTIM_MOMENTS16 1 /* train.moments = bf16: the 16-bit moments' kernels too */\n" : "");
  for (int gi = 0; gi < t->fr->ngraphs && !t->failed; gi++) {
    const FuseGraph *fg = &t->fr->graphs[gi];
    cu_tx(&t->src, "/* ==== graph %s: %d fused kernels ==== */\n\n", fg->graph->name, fg->nkernels);
    for (int kp = 0; kp < fg->nkernels && !t->failed; kp++) kernel(t, gi, kp);
  }
  if (t->opt.emulate && t->emu.len)
    cu_tx(&t->src, "#ifndef __CUDACC__\n/* ==== host entries for the emulation harness (kernels/cuda_emu.h) ==== */\n#include \"hpdl_emu_host.h\"\n\n%s#endif\n", t->emu.s);
  if (t->failed) return -1;
  launch_bytes(t);
  if (t->nspecial) {
    snprintf(t->err, sizeof t->err,
             "%d kernel%s not generated for CUDA: extern calls run on the host, which the CUDA target does not "
             "have yet (use --target cpu)",
             t->nspecial, t->nspecial == 1 ? " is" : "s are");
    return -1;
  }
  return 0;
}

#ifndef HPDL_KERNELS_DIR
#define HPDL_KERNELS_DIR "kernels"
#endif

static const char *kernels_dir(const CgTarget *t) {
  if (t->opt.kernels_dir) return t->opt.kernels_dir;
  const char *e = getenv("HPDL_KERNELS_DIR");
  return e && *e ? e : HPDL_KERNELS_DIR;
}

static int write_file(CgTarget *t, const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) {
    if (f) fclose(f);
    cu_fail(t, "cannot write %s", path);
    return -1;
  }
  return 0;
}

static int copy_text(CgTarget *t, const char *from, const char *to) {
  FILE *f = fopen(from, "rb");
  if (!f) {
    cu_fail(t, "cannot read %s (set HPDL_KERNELS_DIR to the folder of hpdl_cuda.cuh)", from);
    return -1;
  }
  CuText b = {0};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) cu_tx(&b, "%.*s", (int)n, buf);
  fclose(f);
  int rc = write_file(t, to, b.s ? b.s : "", b.len);
  free(b.s);
  return rc;
}

/* The generated source's line `line` and the kernel it belongs to, for a
 * compile error: the NVRTC log names lines of generated code. */
static void error_context(CgTarget *t, const char *log, const char *prog, char *out, size_t n) {
  char key[300];
  snprintf(key, sizeof key, "%s(", prog);
  /* the first error's line (warnings, "declared but never referenced", may come first) */
  long line = 0;
  for (const char *p = log ? strstr(log, key) : NULL; p; p = strstr(p + 1, key)) {
    char *end = NULL;
    long at = strtol(p + strlen(key), &end, 10);
    if (!line) line = at;
    if (end && !strncmp(end, "): error", 8)) {
      line = at;
      break;
    }
  }
  out[0] = '\0';
  if (line <= 0 || !t->src.s) return;
  const char *s = t->src.s, *kern = NULL, *prov = NULL;
  long at = 1;
  const char *l = s;
  for (; *l && at < line; l++) {
    if (!strncmp(l, "extern \"C\" __global__", strlen("extern \"C\" __global__"))) kern = l;
    if (!strncmp(l, "/* hpd_", 7) && strstr(l, " kernel ") && (!strchr(l, '\n') || strstr(l, " kernel ") < strchr(l, '\n')))
      prov = l;
    if (*l == '\n') at++;
  }
  const char *e = strchr(l, '\n');
  char name[200] = "?";
  if (kern) { /* extern "C" __global__ void __launch_bounds__(N) NAME( */
    const char *b = strstr(kern, "__launch_bounds__(");
    b = b ? strchr(b, ')') : NULL;
    const char *q = b ? strchr(b + 1, '(') : NULL;
    if (b && q && q - b > 2) snprintf(name, sizeof name, "%.*s", (int)(q - b - 2), b + 2);
  }
  const char *pe = prov ? strchr(prov, '\n') : NULL;
  snprintf(out, n, "; generated line %ld of kernel %s: %.*s%s%.*s", line, name, e ? (int)(e - l) : (int)strlen(l), l,
           prov ? "; it computes " : "", prov ? (int)(pe ? pe - prov : (long)strlen(prov)) : 0, prov ? prov : "");
}

int cg_cuda_aux_node(const FuseGraph *fg, int kp) {
  const FuseKernel *K = &fg->kernels[kp];
  for (int j = 0; j < K->nnodes && K->kind == FUSE_SPECIAL; j++)
    if (fg->graph->nodes[K->nodes[j]].op == IR_AUX_LOSS) return K->nodes[j];
  return -1;
}

static json_t *int_array(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

/* The fused graphs as the host program walks them (runtime/device/devexec.h): per
 * graph its kernels in order, each with its kind (run: launches of it are
 * in "launches"; view, leaf, call, comm: the host's), the values it reads
 * and writes, and for the host's kinds its nodes. */
static json_t *fused_json(const CgTarget *t) {
  json_t *gs = json_array();
  for (int gi = 0; gi < t->fr->ngraphs; gi++) {
    const FuseGraph *fg = &t->fr->graphs[gi];
    json_t *ks = json_array();
    for (int kp = 0; kp < fg->nkernels; kp++) {
      const FuseKernel *K = &fg->kernels[kp];
      const char *kind = K->kind == FUSE_VIEW   ? "view"
                         : K->kind == FUSE_LEAF ? "leaf"
                         : K->kind == FUSE_CALL ? "call"
                         : K->kind == FUSE_COMM ? "comm"
                                                : "run";
      json_t *k = json_pack("{s:s, s:o, s:o}", "kind", kind, "inputs", int_array(K->inputs, K->ninputs), "outputs",
                            int_array(K->outputs, K->noutputs));
      if (K->kind == FUSE_VIEW || K->kind == FUSE_LEAF || K->kind == FUSE_CALL || K->kind == FUSE_COMM)
        json_object_set_new(k, "nodes", int_array(K->nodes, K->kind == FUSE_VIEW || K->kind == FUSE_COMM ? K->nnodes : 1));
      /* an auxiliary loss: the host program adds weight x its loss up */
      int aux = cg_cuda_aux_node(fg, kp);
      if (aux >= 0) json_object_set_new(k, "aux_node", json_integer(aux));
      json_array_append_new(ks, k);
    }
    /* a pipeline step's halves: its first backward kernel (-1: not cut) */
    int cut = -1;
    if (fuse_can_cut(fg))
      for (int kp = 0; kp < fg->nkernels && cut < 0; kp++)
        if (fuse_kernel_part(fg, kp)) cut = kp;
    json_array_append_new(gs, json_pack("{s:s, s:o, s:i}", "name", fg->graph->name, "kernels", ks, "cut", cut));
  }
  return gs;
}

/* Appends the text of every regular file of dir, in name order, to b. */
static void hash_folder(CuText *b, const char *dir) {
  struct dirent **names = NULL;
  int n = scandir(dir, &names, NULL, alphasort);
  for (int i = 0; i < n; i++) {
    char fn[4352];
    snprintf(fn, sizeof fn, "%s/%s", dir, names[i]->d_name);
    struct stat st;
    FILE *f = stat(fn, &st) == 0 && S_ISREG(st.st_mode) ? fopen(fn, "rb") : NULL;
    if (f) {
      cu_tx(b, "\nfile %s %lld\n", names[i]->d_name, (long long)st.st_size);
      char buf[4096];
      size_t k;
      while ((k = fread(buf, 1, sizeof buf, f)) > 0) cu_tx(b, "%.*s", (int)k, buf);
      fclose(f);
    }
    free(names[i]);
  }
  free(names);
}

/* The emulation library's cache key: the SHA-256 of the compile command,
 * the compiler's `--version`, the kernels folder (the emulation header and
 * the templates the source includes) and the stage's source. 0, or -1 when
 * the compiler does not answer (then nothing is cached). */
static int emulation_key(CgTarget *t, const char *cxx, const char *cmd, char hex[65]) {
  CuText b = {0};
  cu_tx(&b, "hpdl-emu-1\n%s\n", cmd);
  char ver[512];
  snprintf(ver, sizeof ver, "%s --version 2>/dev/null", cxx);
  FILE *p = popen(ver, "r");
  size_t k = 0, got;
  if (p) {
    char buf[1024];
    while ((got = fread(buf, 1, sizeof buf, p)) > 0) {
      cu_tx(&b, "%.*s", (int)got, buf);
      k += got;
    }
    if (pclose(p) != 0) k = 0;
  }
  if (!k) {
    free(b.s);
    return -1;
  }
  hash_folder(&b, kernels_dir(t));
  cu_tx(&b, "\nsource\n%.*s", (int)t->src.len, t->src.s ? t->src.s : "");
  cudacc_sha256_hex(b.s, b.len, hex);
  free(b.s);
  return 0;
}

/* 1 when path starts as an ELF file does: a cache entry damaged on disk
 * is compiled again rather than shipped. */
static int is_elf(const char *path) {
  FILE *f = fopen(path, "rb");
  unsigned char head[4] = {0};
  int ok = f && fread(head, 1, 4, f) == 4 && !memcmp(head, "\x7f" "ELF", 4);
  if (f) fclose(f);
  return ok;
}

/* CgOptions.emulate: PATH.emu.so, the source (with its host entries) as
 * C++ through the emulation harness, for hpdlrun --device emulate. The C++
 * compile takes seconds a stage and many artifacts share a stage's source
 * (the same kernels at another data-parallel width), so the library is kept
 * in the NVRTC cache's folder under emu/, keyed by emulation_key, unless
 * --no-cache: written under a temporary name and renamed, so concurrent
 * compiles never see half of one; a hit marks the entry used and a store
 * trims the cache to its limit (cudacc_cache_trim). A cache that cannot be written is passed
 * over silently: the artifact is complete either way. */
static int build_emulation(CgTarget *t, const char *path) {
  const char *cxx = getenv("HPDL_CXX");
  if (!cxx || !*cxx) cxx = "c++";
  char flags[8192], cmd[16384];
  snprintf(flags, sizeof flags,
           "%s -std=c++17 -O2 -ffp-contract=off -fPIC -shared -fno-strict-aliasing -w -include '%s/cuda_emu.h' -I'%s' -x c++",
           cxx, kernels_dir(t), kernels_dir(t));
  char dir[4096], hex[65], entry[4400] = "";
  if (!t->opt.no_cache && cudacc_cache_dir(dir, sizeof dir) == 0 && emulation_key(t, cxx, flags, hex) == 0) {
    snprintf(entry, sizeof entry, "%s/emu/%s.so", dir, hex);
    char target[4400];
    snprintf(target, sizeof target, "%s.emu.so", path);
    char why[1000];
    if (is_elf(entry) && fs_copy_file(entry, target, why, sizeof why) == 0) {
      cudacc_cache_touch(entry);
      t->emu_built = 2;
      return 0;
    }
    snprintf(target, sizeof target, "%s/emu", dir);
    mkdir(dir, 0755);
    mkdir(target, 0755);
  }
  snprintf(cmd, sizeof cmd, "%s '%s.cu' -o '%s.emu.so' 2> '%s.emu.log'", flags, path, path, path);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int failed = system(cmd) != 0;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  t->emu_seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  t->emu_built = 1;
  if (failed) {
    cu_fail(t, "the emulation's kernels did not compile as C++ with %s (--emulate; set HPDL_CXX): see %s.emu.log", cxx, path);
    return -1;
  }
  char log[4200];
  snprintf(log, sizeof log, "%s.emu.log", path);
  remove(log);
  if (*entry) {
    char built[4200], why[1000];
    snprintf(built, sizeof built, "%s.emu.so", path);
    if (fs_copy_file(built, entry, why, sizeof why) == 0) cudacc_cache_trim(dir, entry);
  }
  return 0;
}

/* Writes PATH.cu (with the kernels/ headers it includes beside it), PATH.cubin and PATH.ptx
 * for the arch through NVRTC, and PATH.kernels.json: the arch, NVRTC's
 * version and options, the source hash, and per launch its kernel, graph,
 * launch shape and resources. */
static int cu_emit(CgTarget *t, const char *path) {
  if (t->failed) return -1;
  char fn[4096], dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  else snprintf(dir, sizeof dir, ".");
  snprintf(fn, sizeof fn, "%s.cu", path);
  if (write_file(t, fn, t->src.s, t->src.len)) return -1;
  char from[4200], to[4200];
  static const char *const headers[] = {"hpdl_cuda.cuh", "hpdl_optim.cuh", "hpdl_attention.cuh", "hpdl_attention_cfg.h",
                                        "hpdl_conv.cuh", "hpdl_lmce.cuh", "hpdl_moe.cuh"};
  for (size_t h = 0; h < sizeof headers / sizeof headers[0]; h++) {
    const char *header = headers[h];
    snprintf(from, sizeof from, "%s/%s", kernels_dir(t), header);
    snprintf(to, sizeof to, "%s/%s", dir, header);
    if (copy_text(t, from, to)) return -1;
  }
  const char *arch = t->opt.arch ? t->opt.arch : "sm_80";
  const char *incs[1] = {dir};
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  char name[256];
  snprintf(name, sizeof name, "%s.cu", base);
  CudaccRequest rq = {t->src.s, name, arch, NULL, 0, incs, 1, !t->opt.no_cache};
  CudaccResult r;
  char err[1024] = "";
  if (cudacc_compile(&rq, &r, err, sizeof err)) {
    char ctx[600], logp[4200] = "";
    error_context(t, r.log, name, ctx, sizeof ctx);
    if (r.log && *r.log) {
      snprintf(logp, sizeof logp, "%s.nvrtc.log", path);
      if (write_file(t, logp, r.log, strlen(r.log))) logp[0] = '\0';
      t->failed = 0; /* a log we could not write is not the error to report */
    }
    cu_fail(t, "NVRTC: %s%s%s%s", err, ctx, logp[0] ? "; the whole log is in " : "", logp);
    cudacc_result_free(&r);
    return -1;
  }
  snprintf(fn, sizeof fn, "%s.cubin", path);
  int rc = write_file(t, fn, r.cubin, r.cubin_size);
  snprintf(fn, sizeof fn, "%s.ptx", path);
  if (!rc) rc = write_file(t, fn, r.ptx, r.ptx_size);
  if (!rc) {
    json_t *root = json_object(), *opts = json_array(), *ls = json_array();
    for (size_t i = 0; i < r.n_options; i++) json_array_append_new(opts, json_string(r.options[i]));
    for (int i = 0; i < t->nlaunch; i++) {
      const CuLaunch *l = &t->launch[i];
      json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:I, s:I}", "name", l->name, "kind", l->kind, "graph",
                            t->fr->graphs[l->graph].graph->name, "graph_index", l->graph, "kernel", l->kernel, "step", l->step,
                            "grid", (json_int_t)l->grid, "block", (json_int_t)l->block);
      if (l->flops > 0) json_object_set_new(j, "flops", json_real(l->flops));
      if (l->bytes > 0) json_object_set_new(j, "bytes", json_real(l->bytes));
      if (l->kernel_bytes > 0) json_object_set_new(j, "kernel_bytes", json_real(l->kernel_bytes));
      if (!strcmp(l->kind, "host")) {
        json_t *hio = json_array();
        for (int h = 0; h < l->nhost_io; h++) json_array_append_new(hio, json_integer(l->host_io[h]));
        json_object_set_new(j, "host", json_pack("{s:i, s:b, s:o}", "extern", l->host_extern, "grad", l->host_grad, "io", hio));
      }
      if (!strcmp(l->kind, "grouped"))
        json_object_set_new(j, "grouped", json_pack("{s:i, s:i, s:I}", "kind", l->grouped, "ids", l->grouped_ids, "experts",
                                                    (json_int_t)l->experts));
      if (!strcmp(l->kind, "gemm") || !strcmp(l->kind, "grouped")) {
        json_object_set_new(j, "gemm",
                            json_pack("{s:i, s:i, s:i, s:b, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I}", "a",
                                      l->gemm_a, "b", l->gemm_b, "c", l->gemm_c, "trans_a", l->trans_a, "trans_b", l->trans_b,
                                      "m", (json_int_t)l->m, "n", (json_int_t)l->n, "k", (json_int_t)l->k, "lda",
                                      (json_int_t)l->lda, "ldb", (json_int_t)l->ldb, "ldc", (json_int_t)l->ldc, "alpha",
                                      l->alpha, "batch", (json_int_t)l->batch, "stride_a", (json_int_t)l->stride_a,
                                      "stride_b", (json_int_t)l->stride_b, "stride_c", (json_int_t)l->stride_c));
        if (l->ab_bf16) json_object_set_new(json_object_get(j, "gemm"), "ab_type", json_string("bf16"));
        if (l->c_bf16) json_object_set_new(json_object_get(j, "gemm"), "c_type", json_string("bf16"));
        if (l->batch_axes) {
          json_t *bd = json_array(), *jsa = json_array(), *jsb = json_array();
          for (int q = 0; q < l->batch_axes; q++) {
            json_array_append_new(bd, json_integer(l->bdims[q]));
            json_array_append_new(jsa, json_integer(l->sa[q]));
            json_array_append_new(jsb, json_integer(l->sb[q]));
          }
          json_object_set_new(json_object_get(j, "gemm"), "batch_axes",
                              json_pack("{s:o, s:o, s:o, s:I, s:I}", "dims", bd, "stride_a", jsa, "stride_b", jsb,
                                        "matrix_a", (json_int_t)l->amat, "matrix_b", (json_int_t)l->bmat));
        }
        if (l->epilogue)
          json_object_set_new(json_object_get(j, "gemm"), "epilogue",
                              json_pack("{s:s, s:i, s:i}", "kind", l->epilogue, "bias", l->bias, "aux", l->aux));
      }
      for (size_t q = 0; q < r.n_kernels; q++)
        if (!strcmp(r.kernels[q].name, l->name)) {
          json_object_set_new(j, "registers", json_integer(r.kernels[q].registers));
          json_object_set_new(j, "shared_bytes", json_integer(r.kernels[q].smem_bytes));
          json_object_set_new(j, "spill_bytes", json_integer(r.kernels[q].spill_store + r.kernels[q].spill_load));
        }
      json_array_append_new(ls, j);
    }
    json_object_set_new(root, "arch", json_string(arch));
    char ver[32];
    snprintf(ver, sizeof ver, "%d.%d", r.nvrtc_major, r.nvrtc_minor);
    json_object_set_new(root, "nvrtc", json_string(ver));
    json_object_set_new(root, "options", opts);
    json_object_set_new(root, "source_sha256", json_string(r.hash));
    json_object_set_new(root, "cache_hit", json_boolean(r.cache_hit));
    json_object_set_new(root, "nvrtc_seconds", json_real(r.seconds));
    json_object_set_new(root, "launches", ls);
    json_object_set_new(root, "graphs", fused_json(t));
    snprintf(fn, sizeof fn, "%s.kernels.json", path);
    if (json_dump_file(root, fn, JSON_INDENT(1) | JSON_PRESERVE_ORDER)) {
      cu_fail(t, "cannot write %s", fn);
      rc = -1;
    }
    json_decref(root);
  }
  if (!rc && t->opt.emulate) rc = build_emulation(t, path);
  if (r.warning && !t->opt.no_cache) snprintf(t->warning, sizeof t->warning, "%s", r.warning);
  if (t->have_result) cudacc_result_free(&t->result);
  t->result = r; /* kept for cg_cuda_report */
  t->have_result = 1;
  return rc;
}

static char *cu_dump(CgTarget *t) {
  char *s = xalloc_malloc(t->src.len + 1);
  memcpy(s, t->src.s ? t->src.s : "", t->src.len);
  s[t->src.len] = '\0';
  return s;
}

static const char *cu_error(const CgTarget *t) { return t->err; }
static const CgStats *cu_stats(const CgTarget *t) { return &t->stats; }

static void cu_destroy(CgTarget *t) {
  if (!t) return;
  free(t->emu.s);
  if (t->have_result) cudacc_result_free(&t->result);
  free(t->launch);
  free(t->src.s);
  free(t);
}

static const CgBackend cuda_backend = {"cuda", cu_create, cu_generate, cu_emit, cu_dump, cu_error, cu_stats, cu_destroy};

const CgBackend *cg_cuda_backend(void) { return &cuda_backend; }

const CgCudaLaunch *cg_cuda_launches(const CgTarget *t, int *n) {
  *n = t->nlaunch;
  return t->launch;
}

int cg_cuda_pending(const CgTarget *t, int *gemms, int *specials) {
  if (gemms) *gemms = t->ngemm;
  if (specials) *specials = t->nspecial;
  return t->failed ? -1 : t->ngemm + t->nspecial;
}

void cg_cuda_report(const CgTarget *t, FILE *out) {
  const CudaccResult *r = t->have_result ? &t->result : NULL;
  if (r)
    fprintf(out, "  %s, NVRTC %d.%d%s, %.2f s; per kernel: registers, shared memory, spills, launch\n", t->opt.arch ? t->opt.arch : "sm_80",
            r->nvrtc_major, r->nvrtc_minor, r->cache_hit ? " (cached)" : "", r->seconds);
  if (t->emu_built == 2) fprintf(out, "  emulation library (--emulate): from the cache\n");
  if (t->emu_built == 1) fprintf(out, "  emulation library (--emulate): C++ compile, %.2f s\n", t->emu_seconds);
  for (int i = 0; i < t->nlaunch; i++) {
    const CuLaunch *l = &t->launch[i];
    const CudaccKernelInfo *ki = NULL;
    for (size_t q = 0; r && q < r->n_kernels; q++)
      if (!strcmp(r->kernels[q].name, l->name)) ki = &r->kernels[q];
    fprintf(out, "  %-36s %-7s", l->name, l->kind);
    if (!strcmp(l->kind, "gemm")) {
      fprintf(out, " cuBLASLt %" PRId64 " x %" PRId64 " x %" PRId64 "%s%s, %" PRId64 " matri%s\n", l->m, l->n, l->k,
              l->trans_a ? ", A^T" : "", l->trans_b ? ", B^T" : "", l->batch, l->batch == 1 ? "x" : "ces");
      continue;
    }
    if (!strcmp(l->kind, "grouped")) {
      fprintf(out, " cuBLASLt per expert of %" PRId64 ", %" PRId64 " x %" PRId64 " x %" PRId64 " in all%s%s%s\n", l->experts, l->m,
              l->n, l->k, l->trans_a ? ", A^T" : "", l->trans_b ? ", B^T" : "", l->grouped == 2 ? " (weight gradient)" : "");
      continue;
    }
    if (ki)
      fprintf(out, " %3d regs %6ld B smem %s", ki->registers, ki->smem_bytes,
              ki->spill_store + ki->spill_load ? "SPILLS" : "no spills");
    fprintf(out, "  grid %" PRId64 " x block %" PRId64 "\n", l->grid, l->block);
  }
  if (t->warning[0]) fprintf(out, "  note: %s\n", t->warning);
}
