/* hostop.c - ops computed on the host for generated code (see hostop.h). */
#include "hostop.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm16.h"
#include "interp.h"
#include "xalloc.h"

int hostop_supported(IrOp op) {
  switch (op) {
  case IR_TOPK:
  case IR_TAKE:
  case IR_TAKE_BWD:
  case IR_ONE_HOT:
  case IR_MOE_DISPATCH:
  case IR_MOE_COMBINE:
  case IR_MOE_GATE_GRAD:
  case IR_MOE_EXPERT_IDS:
  case IR_GROUPED_MM:
  case IR_GROUPED_MM_WGRAD:
  case IR_AUX_LOSS:
  case IR_LOSS_SEED:
  case IR_TRAINING:
  case IR_ALL_TO_ALL:
  case IR_ATTENTION:
  case IR_ATTENTION_BWD:
  case IR_ATTN_MERGE:
  case IR_CONV2D:
  case IR_CONV2D_BWD_DATA:
  case IR_CONV2D_BWD_FILTER:
  case IR_POOL2D:
  case IR_POOL2D_BWD:
  case IR_STATE_UPDATE: return 1;
  default: return ir_linear_role(op) != IR_LINEAR_NONE;
  }
}

static const char *failf(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static const char *failf(char *err, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
  return err;
}

/* MOE_DISPATCH, MOE_COMBINE, MOE_GATE_GRAD (ir_ops.h), sequence by sequence;
 * in the packed form (y [B T K, C]) a choice's row is numbered over all the
 * sequences (b E cap + slot with cap = 0). */
static const char *moe(const IrGraph *g, const IrNode *n, void **bufs, char *err, size_t errlen) {
  int iidx = n->op == IR_MOE_GATE_GRAD ? 2 : 1;
  const IrNode *idxn = &g->nodes[n->in[iidx]];
  const IrNode *wide = n->op == IR_MOE_DISPATCH ? n : &g->nodes[n->in[n->op == IR_MOE_COMBINE ? 0 : 1]];
  int64_t B = idxn->dims[0], T = idxn->dims[1], K = idxn->dims[2];
  int packed = wide->rank == 2;
  int64_t E = packed ? n->attr[0] : wide->dims[1], cap = packed ? 0 : wide->dims[2], C = wide->dims[wide->rank - 1];
  const float *A = bufs[0];
  const int32_t *I = bufs[iidx];
  const float *W = n->op == IR_MOE_GATE_GRAD ? bufs[1] : bufs[2];
  float *out = bufs[3];
  int64_t nc = packed ? B * T * K : T * K;
  int64_t *choice = xalloc_calloc((size_t)(nc + 1), sizeof(int64_t)), *rows = xalloc_calloc((size_t)(nc + E + 1), sizeof(int64_t));
  int64_t *count = rows + nc, *slot = rows;
  const char *e = NULL;
  memset(out, 0, sizeof(float) * (size_t)ir_numel(n));
  for (int64_t b = 0; b < B && !e; b++) {
    if (!packed || b == 0) {
      for (int64_t p = 0; p < nc; p++) choice[p] = I[b * T * K + p];
      int64_t bad = packed ? interp_moe_rows(choice, nc, E, rows, count) : interp_moe_slots(choice, T, K, E, cap, slot, count);
      if (bad >= 0) {
        e = failf(err, errlen, "%s: expert %" PRId64 " is outside [0, %" PRId64 ")", ir_op_name(n->op), choice[bad], E);
        break;
      }
    }
    if (packed) slot = rows + b * T * K;
    for (int64_t p = 0; p < T * K; p++) {
      if (slot[p] < 0) continue;
      int64_t t = p / K;
      float *wr = n->op == IR_MOE_GATE_GRAD ? NULL : (float *)(n->op == IR_MOE_DISPATCH ? out : A) + (b * E * cap + slot[p]) * C;
      if (n->op == IR_MOE_DISPATCH) {
        float w = W[b * T * K + p];
        const float *src = A + (b * T + t) * C;
        for (int64_t c = 0; c < C; c++) wr[c] = w * src[c];
      } else if (n->op == IR_MOE_COMBINE) {
        float w = W[b * T * K + p], *tok = out + (b * T + t) * C;
        for (int64_t c = 0; c < C; c++) tok[c] += w * wr[c];
      } else {
        const float *a = A + (b * T + t) * C, *y = W + (b * E * cap + slot[p]) * C;
        double dot = 0;
        for (int64_t c = 0; c < C; c++) dot += (double)a[c] * y[c];
        out[b * T * K + p] = (float)dot;
      }
    }
  }
  free(choice);
  free(rows);
  return e;
}

/* MOE_EXPERT_IDS: the choices' experts sorted (a counting sort) */
static const char *expert_ids(const IrNode *n, void **bufs, char *err, size_t errlen) {
  const int32_t *I = bufs[0];
  int32_t *out = bufs[1];
  int64_t N = n->dims[0], E = n->attr[0];
  int64_t *count = xalloc_calloc((size_t)(E + 1), sizeof(int64_t));
  for (int64_t c = 0; c < N; c++) {
    if (I[c] < 0 || I[c] >= E) {
      free(count);
      return failf(err, errlen, "moe_expert_ids: expert %d is outside [0, %" PRId64 ")", (int)I[c], E);
    }
    count[I[c]]++;
  }
  for (int64_t x = 0, o = 0; x < E; x++)
    for (int64_t j = 0; j < count[x]; j++) out[o++] = (int32_t)x;
  free(count);
  return NULL;
}

/* GROUPED_MM and GROUPED_MM_WGRAD (ir_ops.h): one GEMM a run of rows of the
 * same expert (one an expert: the ids come sorted), through the env's BLAS, or
 * for bf16 operands (precision.c rounds a grouped GEMM's as a matmul's) through
 * core/numeric/gemm16.h as the CPU back end's bf16 GEMMs; with HOSTOP_ADD the
 * weight gradient is added into its buffer. */
static const char *grouped_mm(const IrGraph *g, const IrNode *n, void **bufs, HostOpEnv *env, int flags, char *err, size_t errlen) {
  const IrNode *a = &g->nodes[n->in[0]], *b = &g->nodes[n->in[1]];
  int bf16 = a->dtype == DT_BF16;
  if (a->dtype != b->dtype || (!bf16 && a->dtype != DT_F32))
    return failf(err, errlen, "%s reads both operands f32 or both bf16, not %s and %s", ir_op_name(n->op), sem_dtype_name(a->dtype),
                 sem_dtype_name(b->dtype));
  const int32_t *ids = bufs[2];
  float *out = bufs[3];
  AttnSgemm gemm = env->sgemm ? env->sgemm : attn_loop_sgemm;
  int64_t N = a->dims[0], X = a->dims[1];
  int64_t E = n->op == IR_GROUPED_MM ? b->dims[0] : n->dims[0];
  for (int64_t i = 0; i < N; i++)
    if (ids[i] < 0 || ids[i] >= E)
      return failf(err, errlen, "%s: row %" PRId64 "'s expert %d is outside [0, %" PRId64 ")", ir_op_name(n->op), i, (int)ids[i], E);
  int t = n->op == IR_GROUPED_MM && n->attr[0] != 0, wgrad = n->op == IR_GROUPED_MM_WGRAD;
  int64_t Y = wgrad ? b->dims[1] : n->dims[1];
  size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
  if (wgrad && !(flags & HOSTOP_ADD)) memset(out, 0, sizeof(float) * (size_t)ir_numel(n));
  for (int64_t r0 = 0, r1; r0 < N; r0 = r1) {
    int64_t e = ids[r0];
    for (r1 = r0 + 1; r1 < N && ids[r1] == e; r1++) {
    }
    /* op(A) [m, k] op(B) [k, n] into C: a run's rows times the expert's matrix, or its weight gradient */
    int ta = wgrad, tb = t;
    int64_t m = wgrad ? X : r1 - r0, nn = Y, k = wgrad ? r1 - r0 : X, ldb = wgrad ? Y : t ? X : Y;
    const char *pa = (const char *)bufs[0] + (size_t)(r0 * X) * es;
    const char *pb = (const char *)bufs[1] + (size_t)(wgrad ? r0 * Y : e * X * Y) * es;
    float *pc = out + (wgrad ? e * X * Y : r0 * Y), beta = wgrad ? 1.0f : 0.0f;
    if (!bf16) {
      gemm(ta, tb, m, nn, k, 1.0f, (const float *)pa, X, (const float *)pb, ldb, beta, pc, Y);
      continue;
    }
    char why[256];
    if (gemm16_bf16(ta, tb, m, nn, k, 1.0f, (const uint16_t *)pa, X, (const uint16_t *)pb, ldb, beta, pc, Y, gemm, env->nthreads,
                    why, sizeof why))
      return failf(err, errlen, "%s: %s", ir_op_name(n->op), why);
  }
  return NULL;
}

static const char *all_to_all(const IrGraph *g, const IrNode *n, void **bufs, HostOpEnv *env, char *err, size_t errlen) {
  const IrNode *x = &g->nodes[n->in[0]];
  int grp = (int)n->attr[0], size = grp >= 0 && grp < IRG_COUNT && env->size[grp] > 0 ? env->size[grp] : 1;
  int64_t split = n->attr[1], concat = n->attr[2], NX = ir_numel(x);
  if (size == 1) {
    memcpy(bufs[1], bufs[0], sizeof(float) * (size_t)NX);
    return NULL;
  }
  if (!env->all_to_all) return failf(err, errlen, "all_to_all over %s: the runtime has no all-to-all", ir_group_name((IrGroup)grp));
  float *send = xalloc_calloc((size_t)NX, sizeof(float)), *recv = xalloc_calloc((size_t)NX, sizeof(float));
  interp_a2a_pack(x, split, size, bufs[0], send, sizeof(float));
  int rc = env->all_to_all(env->comm, grp, send, NX / size, recv);
  if (rc == 0) interp_a2a_unpack(x, split, concat, size, recv, bufs[1], sizeof(float));
  free(send);
  free(recv);
  return rc ? failf(err, errlen, "all_to_all over %s failed", ir_group_name((IrGroup)grp)) : NULL;
}

int hostop_aux_counted(const IrGraph *g, int node) {
  size_t ln = g->name ? strlen(g->name) : 0;
  int backward = g->fb_split > 0 ? node >= g->fb_split : (ln >= 5 && !strcmp(g->name + ln - 5, ".grad"));
  return !backward;
}

/* ATTENTION and ATTENTION_BWD through core/attn.c, positions as ir_ops.h gives them. */
static const char *attention(const IrGraph *g, const IrNode *n, void **bufs, HostOpEnv *env, char *err, size_t errlen) {
  const IrNode *q = &g->nodes[n->in[0]], *k = &g->nodes[n->in[1]], *v = &g->nodes[n->in[2]];
  AttnShape s = {q->dims[0], q->dims[1], k->dims[1], q->dims[2], k->dims[2], q->dims[3], v->dims[3], n->fattr, (int)n->attr[0],
                 0, 1, 0, 1, env->sgemm, env->par_for, env->par, n->attr[3], 0};
  int64_t rg = n->attr[1] - 1, cg = n->attr[2] - 1;
  if (rg >= 0 && rg < IRG_COUNT) s.row_rank = env->rank[rg], s.row_size = env->size[rg];
  if (cg >= 0 && cg < IRG_COUNT) s.col_rank = env->rank[cg], s.col_size = env->size[cg];
  if (cg >= 0 && cg < IRG_COUNT && n->attr[4] > 0 && s.col_size > 1) { /* one ring block (ir_ops.h) */
    int c = s.col_size;
    s.col_rank = (int)(((s.col_rank - (n->attr[4] - 1)) % c + c) % c);
    s.col_span = s.S * c;
  }
  const char *why = n->op == IR_ATTENTION ? attn_forward(&s, bufs[0], bufs[1], bufs[2], bufs[3])
                                          : attn_backward(&s, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5]);
  return why ? failf(err, errlen, "%s: %s", ir_op_name(n->op), why) : NULL;
}

/* CONV2D, its gradients and POOL2D through core/conv.c (im2col + the BLAS). */
static const char *conv(const IrGraph *g, const IrNode *n, void **bufs, HostOpEnv *env, char *err, size_t errlen) {
  if (n->op == IR_POOL2D || n->op == IR_POOL2D_BWD) {
    PoolShape s = ir_pool_shape(g, n);
    if (n->op == IR_POOL2D) pool_forward_f32(&s, bufs[0], bufs[1]);
    else pool_backward_f32(&s, bufs[0], bufs[1], bufs[2]);
    return NULL;
  }
  ConvShape s = ir_conv_shape(g, n);
  const char *why = n->op == IR_CONV2D          ? conv_forward_f32(&s, bufs[0], bufs[1], bufs[2], env->sgemm, env->par_for, env->par)
                    : n->op == IR_CONV2D_BWD_DATA ? conv_bwd_data_f32(&s, bufs[0], bufs[1], bufs[2], env->sgemm, env->par_for, env->par)
                                                  : conv_bwd_filter_f32(&s, bufs[0], bufs[1], bufs[2], env->sgemm);
  return why ? failf(err, errlen, "%s: %s", ir_op_name(n->op), why) : NULL;
}

/* LINEAR_CE, LINEAR_LSE and their gradients through core/numeric/lmce.c. A
 * gradient pair (HOSTOP_PAIR, on the dx op) makes dx and dw in one pass
 * over the logits: dw is the buffer after dx's, added into with HOSTOP_ADD.
 * LINEAR_LSE on a padded vocabulary's shard takes the prefix of its columns
 * before the padding (none: its rows' log-sum-exp is -inf, its gradients 0). */
static const char *linear_ce(const IrGraph *g, const IrNode *n, int flags, void **bufs, HostOpEnv *env, char *err, size_t errlen) {
  const IrNode *x = &g->nodes[n->in[0]], *w = &g->nodes[n->in[1]];
  int rows_w = n->attr[0] != 0, bf16 = x->dtype == DT_BF16 && w->dtype == DT_BF16, add = (flags & HOSTOP_ADD) != 0;
  if (!bf16 && (x->dtype != DT_F32 || w->dtype != DT_F32))
    return failf(err, errlen, "%s reads x and w both f32 or both bf16, not %s and %s", ir_op_name(n->op), sem_dtype_name(x->dtype),
                 sem_dtype_name(w->dtype));
  int targets = ir_linear_targets(n->op);
  IrLinearRole role = ir_linear_role(n->op);
  int64_t C = x->dims[x->rank - 1], V = w->dims[rows_w ? 0 : 1], rows = ir_numel(x) / C, valid = V;
  if (!targets) {
    int grp = (int)n->attr[1] - 1;
    valid = ir_vocab_prefix(n->attr[2], grp >= 0 && grp < IRG_COUNT ? (int64_t)env->rank[grp] * V : 0, V);
  }
  LceShape s = {rows, C, valid, rows_w, env->sgemm, env->par_for, env->par, bf16, env->nthreads, V};
  /* inputs (n->nin): x, w, [t], nll or lse, dy; then dx and / or dw */
  int ni = n->nin;
  const int32_t *t = targets ? bufs[2] : NULL;
  float *out = bufs[ni];
  float *dx = role == IR_LINEAR_DX ? out : NULL;
  float *dw = role == IR_LINEAR_DW ? out : (flags & HOSTOP_PAIR) ? bufs[ni + 1] : NULL;
  if (valid < V && dw && !add) { /* the padding's rows get no gradient: zero, then add into */
    memset(dw, 0, sizeof(float) * (size_t)(V * C));
    add = 1;
  }
  const char *why = NULL;
  if (valid == 0) { /* a shard of padding alone */
    if (role == IR_LINEAR_ROWS)
      for (int64_t r = 0; r < rows; r++) out[r] = -INFINITY;
    if (dx) memset(dx, 0, sizeof(float) * (size_t)(rows * C));
    return NULL;
  }
  if (role == IR_LINEAR_ROWS) why = lce_forward(&s, bufs[0], bufs[1], t, out);
  else why = lce_backward(&s, bufs[0], bufs[1], t, bufs[ni - 2], bufs[ni - 1], dx, dw, add);
  return why ? failf(err, errlen, "%s", why) : NULL;
}

const char *hostop_run(const IrGraph *g, int node, void **bufs, HostOpEnv *env, char *err, size_t errlen) {
  int flags = node & (HOSTOP_PAIR | HOSTOP_ADD);
  node &= ~(HOSTOP_PAIR | HOSTOP_ADD);
  const IrNode *n = &g->nodes[node];
  const IrNode *x = n->nin > 0 ? &g->nodes[n->in[0]] : NULL;
  int64_t N = ir_numel(n);
  switch (n->op) {
  case IR_TOPK: {
    int64_t V = x->dims[x->rank - 1], K = n->attr[0], rows = V ? ir_numel(x) / V : 0;
    int64_t *pos = xalloc_calloc((size_t)(rows * K + 1), sizeof(int64_t));
    interp_topk(NULL, bufs[0], rows, V, K, pos);
    for (int64_t p = 0; p < rows * K; p++) ((int32_t *)bufs[1])[p] = (int32_t)pos[p];
    free(pos);
    return NULL;
  }
  case IR_TAKE:
  case IR_TAKE_BWD: {
    const IrNode *t = &g->nodes[n->in[1]];
    const float *X = bufs[0];
    const int32_t *I = bufs[1];
    float *out = bufs[2];
    int64_t K = t->dims[t->rank - 1], V = n->op == IR_TAKE ? x->dims[x->rank - 1] : n->dims[n->rank - 1], P = ir_numel(t);
    if (n->op == IR_TAKE_BWD) memset(out, 0, sizeof(float) * (size_t)N);
    for (int64_t p = 0; p < P; p++) {
      int64_t v = I[p], row = K ? p / K : 0;
      if (v < 0 || v >= V) return failf(err, errlen, "take: index %" PRId64 " is outside [0, %" PRId64 ")", v, V);
      if (n->op == IR_TAKE) out[p] = X[row * V + v];
      else out[row * V + v] += X[p];
    }
    return NULL;
  }
  case IR_ONE_HOT: {
    const int32_t *I = bufs[0];
    float *out = bufs[1];
    int64_t C = n->attr[0], P = ir_numel(x);
    memset(out, 0, sizeof(float) * (size_t)N);
    for (int64_t p = 0; p < P; p++)
      if (I[p] >= 0 && I[p] < C) out[p * C + I[p]] = 1.0f;
    return NULL;
  }
  case IR_MOE_DISPATCH:
  case IR_MOE_COMBINE:
  case IR_MOE_GATE_GRAD: return moe(g, n, bufs, err, errlen);
  case IR_MOE_EXPERT_IDS: return expert_ids(n, bufs, err, errlen);
  case IR_GROUPED_MM:
  case IR_GROUPED_MM_WGRAD: return grouped_mm(g, n, bufs, env, flags, err, errlen);
  case IR_ATTENTION:
  case IR_ATTENTION_BWD: return attention(g, n, bufs, env, err, errlen);
  case IR_ATTN_MERGE: {
    /* bufs: the c blocks' outputs, then the merged output */
    int64_t Dv = n->dims[3] - 1;
    attn_merge((const float *const *)bufs, n->nin, ir_numel(n) / (Dv + 1), Dv, bufs[n->nin]);
    return NULL;
  }
  case IR_CONV2D:
  case IR_CONV2D_BWD_DATA:
  case IR_CONV2D_BWD_FILTER:
  case IR_POOL2D:
  case IR_POOL2D_BWD: return conv(g, n, bufs, env, err, errlen);
  case IR_AUX_LOSS: {
    if (hostop_aux_counted(g, node)) {
      env->aux_sum += n->fattr * ((const float *)bufs[1])[0];
      env->aux_seen = 1;
    }
    if (bufs[2] != bufs[0]) memcpy(bufs[2], bufs[0], sizeof(float) * (size_t)N);
    return NULL;
  }
  case IR_LOSS_SEED: ((float *)bufs[0])[0] = (float)env->loss_seed; return NULL;
  case IR_TRAINING: ((float *)bufs[0])[0] = env->evaluating ? 0.0f : 1.0f; return NULL;
  case IR_STATE_UPDATE: {
    /* the state's new contents, in a forward only (hostop_aux_counted's rule) */
    if (hostop_aux_counted(g, node) && bufs[2] != bufs[1])
      memcpy(bufs[2], bufs[1], sizeof(float) * (size_t)ir_numel(&g->nodes[n->in[1]]));
    if (bufs[3] != bufs[0]) memcpy(bufs[3], bufs[0], sizeof(float) * (size_t)N);
    return NULL;
  }
  case IR_ALL_TO_ALL: return all_to_all(g, n, bufs, env, err, errlen);
  default:
    if (ir_linear_role(n->op) != IR_LINEAR_NONE) return linear_ce(g, n, flags, bufs, env, err, errlen);
    return failf(err, errlen, "%s is not an op the host computes", ir_op_name(n->op));
  }
}
