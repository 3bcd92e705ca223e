/* codegen_cuda_special.c - the CUDA back end's special kernels: the ops
 * that fusion gives a kernel of their own (fuse.h: embedding and its
 * backward, rope, cross-entropy and its backward, pick, repeat_kv_bwd, a
 * multi-group sum_to, extern calls).
 *
 * The semantics are the reference executor's (core/interp.c) and the
 * arithmetic the CPU back end's (codegen_cpu_kernel.c, special_*): values in
 * fp32, loads and stores in each value's dtype, the same formulas. Shapes:
 *   embedding        a grid-stride gather, one element a thread;
 *   embedding_bwd    a deterministic scatter-add, no float atomics: the
 *                    positions are bucketed by id (a counting sort, whose
 *                    integer atomics give the same buckets every run), each
 *                    bucket put in ascending position order, then a block a
 *                    vocabulary row sums its bucket's rows in that order, the
 *                    CPU's sequential order (six launches, _s0.._s5);
 *   rope             a thread per (position, pair, chunk of heads): the angle
 *                    in fp64 as the CPU's table, then the chunk's rotations;
 *   cross_entropy    a block per row (its max and sum of exponentials in one pass, by block
 *                    reductions) writing the row's loss, then one block
 *                    summing the rows in fp64 (two launches);
 *   cross_entropy_bwd  a block per row: softmax - onehot, scaled;
 *   pick, pick_bwd   grid-stride loops (pick_bwd writes its zeros itself);
 *   repeat_kv_bwd, sum_to  a thread per output element summing its inputs
 *                    in ascending order (a gather: no atomics);
 *   topk, take, take_bwd, one_hot  the router's: a thread per row (topk) or
 *                    per output element (take_bwd a gather over the row's k);
 *   moe_dispatch, moe_combine, moe_gate_grad  a thread per sequence assigns
 *                    the slots in GShard's priority, then a thread per output
 *                    element moves the values (two launches);
 *   aux_loss         a copy (the host program adds the auxiliary loss);
 *   attention        kernels/hpdl_attention.cuh's flash attention: one launch
 *                    forward (a block per tile of query rows), three backward
 *                    (the rows' dO . o into scratch, then dk and dv a block per
 *                    tile of keys, then dq a block per tile of rows), in
 *                    hpdl_attention_cfg.h's blocks;
 *   conv2d, conv2d_bwd_data, conv2d_bwd_filter  kernels/hpdl_conv.cuh's implicit
 *                    GEMMs: a block per tile of (output channels or input
 *                    channels) x (positions or filter taps) of a group, in
 *                    hpdl_conv_plan's tiles; the filter gradient's reduction
 *                    over N Ho Wo cut into the rule's splits when it is long
 *                    (partials in scratch, then a thread an element adding
 *                    them in split order: two launches), no atomics;
 *   pool2d, pool2d_bwd  hpdl_conv.cuh's: a thread per output (forward), a
 *                    thread per input element gathering from the windows that
 *                    hold it (backward);
 *   linear_ce, linear_lse and their gradients  kernels/hpdl_lmce.cuh's fused
 *                    head: the forward a block per row tile and vocabulary
 *                    split, then a thread a row merging the splits (two
 *                    launches); the backward (dx, dw, or the pair in one fused
 *                    kernel) the rows' log-sum-exp (linear_ce: a warp a row),
 *                    then dx a block per row tile, dw a block per vocabulary
 *                    tile, each making its logits again.
 * Every output is stored, never accumulated into: each kernel writes every
 * element (the scatters' untouched ones as 0), as the CPU's zero fill then
 * sum gives. Kernels that need scratch between their launches (bucket tables, the
 * rows' losses) keep it in `static __device__` arrays of the module, named
 * after the kernel: a module's launches run in order on one stream, so one
 * copy a kernel suffices.
 *
 * Range checks are the runtime's job: the CPU back end stops with an error
 * on an embedding id or a cross-entropy target out of range, but a kernel
 * has no error channel (hpdl_kctx has none), so here such an id reads as
 * zeros (embedding), adds nothing (embedding_bwd), and such a target gives
 * the row a loss of 0 and a gradient of zeros (cross-entropy). Extern calls
 * run a host function and stay the host program's. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_cuda_int.h"
#include "conv.h"
#include "hostop.h"
#include "hpdl_attention_cfg.h"
#include "hpdl_conv.cuh"
#include "hpdl_lmce.cuh"
#include "hpdl_moe.cuh"
#include "ir_cost.h"

/* Heads (rows of [B, H]) one rope thread rotates with the angle it computed. */
enum { ROPE_CHUNK = 8 };

static const IrNode *nd(const CuKern *k, int id) { return &k->fg->graph->nodes[id]; }

/* Skips the reshapes folded into this kernel: they are views of memory. The
 * buffer's node, not the value's: a shape is read from the value itself
 * (nd(k, n->in[i])), which a folded reshape may have given other dims. */
static int mem_of(const CuKern *k, int v) {
  while (k->fg->kernel_of[v] == k->kp && nd(k, v)->op == IR_RESHAPE) v = nd(k, v)->in[0];
  return v;
}

/* The kernel's main node: the last one that is not a folded reshape. */
static int special_node(const CuKern *k) {
  const FuseKernel *K = k->K;
  for (int j = K->nnodes - 1; j >= 0; j--) /* not a reshape, nor the attention's 16-bit casts and their chain (fuse.c) */
    if (nd(k, K->nodes[j])->op != IR_RESHAPE && nd(k, K->nodes[j])->op != IR_CAST &&
        fuse_attn_out16(k->fg->graph, K->nodes[j]) < 0 && fuse_attn_grad16(k->fg->graph, K->nodes[j]) < 0)
      return K->nodes[j];
  return K->nodes[K->nnodes - 1];
}

/* The parameter index of value v (through folded reshapes), or -1 after cu_fail. */
static int io_of(CuKern *k, int v) {
  int i = cu_io_index(k, mem_of(k, v));
  if (i < 0)
    cu_fail(k->t, "graph %s kernel k%d: %%%d is neither an input nor an output of the kernel", k->fg->graph->name, k->kp,
            v);
  return i;
}

static void step_name(const CuKern *k, int step, int nsteps, char *name, size_t len) {
  if (nsteps == 1) snprintf(name, len, "%s", k->base);
  else snprintf(name, len, "%s_s%d", k->base, step);
}

/* `pN[at] = v;` with v (a float expression) converted to the value's dtype,
 * as codegen_cuda.c's stores. */
static void store(CuText *o, const char *ind, int io, DType dt, const char *at, const char *v) {
  if (dt == DT_F32) cu_tx(o, "%sp%d[%s] = %s;\n", ind, io, at, v);
  else if (dt == DT_F64) cu_tx(o, "%sp%d[%s] = (double)(%s);\n", ind, io, at, v);
  /* 16-bit storage: the bits, rounded to nearest even (an integer cast would truncate the value) */
  else if (dt == DT_BF16) cu_tx(o, "%sp%d[%s] = hpdl_bf16_from_f32(%s);\n", ind, io, at, v);
  else if (dt == DT_F16) cu_tx(o, "%sp%d[%s] = hpdl_f16_from_f32(%s);\n", ind, io, at, v);
  else cu_tx(o, "%sp%d[%s] = (%s)truncf(%s);\n", ind, io, at, cu_c_type(dt), v);
}

/* Threads a block for a row of `n`: a warp per 32 elements, at most CU_BLOCK. */
static int64_t row_block(int64_t n) { return n >= CU_BLOCK ? CU_BLOCK : n < 1 ? 32 : (n + 31) / 32 * 32; }
static int64_t blocks_for(int64_t n) { return (n + CU_BLOCK - 1) / CU_BLOCK; }

/* `for (long long VAR = <global thread>; VAR < N; VAR += <grid threads>) {` */
static void grid_loop(CuText *o, const char *var, int64_t n) {
  cu_tx(o,
        "  for (long long %1$s = (long long)blockIdx.x * blockDim.x + threadIdx.x; %1$s < %2$" PRId64
        "LL; %1$s += (long long)gridDim.x * blockDim.x) {\n",
        var, n);
}

/* This rank's first row of a vocabulary-parallel tensor (attr = 1 + group), as a C expression. */
static void vocab_off(CuText *o, int64_t attr, int64_t V) {
  if (attr) cu_tx(o, "  const long long off = (long long)hpd.rank[%" PRId64 "] * %" PRId64 "LL;\n", attr - 1, V);
  else cu_tx(o, "  const long long off = 0LL;\n");
}

/* ---- embedding: a gather ---- */

static int embedding_fwd(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int tab = io_of(k, n->in[0]), ids = io_of(k, n->in[1]), out = io_of(k, id);
  if (tab < 0 || ids < 0 || out < 0) return -1;
  const IrNode *tn = nd(k, n->in[0]);
  int64_t V = tn->dims[0], C = tn->dims[1], ni = ir_numel(nd(k, mem_of(k, n->in[1])));
  cu_tx(o, "/* %s: embedding: out[i, c] = table[ids[i] - off, c]; an id outside this rank's %" PRId64
        " rows reads as zeros\n * (another shard's row, or out of range: range checks are the runtime's) */\n",
        k->base, V);
  cu_signature(k, o, k->base);
  vocab_off(o, n->attr[0], V);
  grid_loop(o, "lin", ni * C);
  cu_tx(o, "    const long long i = lin / %1$" PRId64 "LL, c = lin - i * %1$" PRId64 "LL;\n", C);
  cu_tx(o, "    const long long row = (long long)p%d[i] - off;\n", ids);
  cu_tx(o, "    const float v = row >= 0 && row < %1$" PRId64 "LL ? (float)p%2$d[row * %3$" PRId64 "LL + c] : 0.0f;\n", V,
        tab, C);
  store(o, "    ", out, n->dtype, "lin", "v");
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(ni * C), CU_BLOCK);
  return 0;
}

/* ---- embedding_bwd: a deterministic scatter-add ----
 * s0 zero the bucket counts; s1 count the positions of each row (integer
 * atomics: the counts do not depend on the order); s2 one block scans the
 * counts into bucket offsets and resets the counts as cursors; s3 each
 * position takes a slot of its bucket (in any order); s4 each position
 * finds its rank among its bucket's positions and moves to that place, so
 * every bucket lists its positions ascending; s5 a block per vocabulary
 * row, a thread per column, sums the bucket's rows in that order and
 * stores the row (zeros for a row no position names): the result is the
 * CPU's sequential sum, bit for bit in f32, and the same every run. */
static int embedding_bwd(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int dy = io_of(k, n->in[0]), ids = io_of(k, n->in[1]), out = io_of(k, id);
  if (dy < 0 || ids < 0 || out < 0) return -1;
  int64_t V = n->dims[0], C = n->dims[1], ni = ir_numel(nd(k, mem_of(k, n->in[1])));
  if (ni > INT32_MAX || V > INT32_MAX) {
    cu_fail(k->t, "graph %s kernel k%d: embedding_bwd over %" PRId64 " positions and %" PRId64
            " rows: the CUDA kernel counts them in 32 bits",
            k->fg->graph->name, k->kp, ni, V);
    return -1;
  }
  const char *b = k->base;
  cu_tx(o, "/* %s: embedding_bwd: out[v, c] = sum over positions i with ids[i] - off == v, ascending, of dy[i, c];\n"
        " * ids outside this rank's %" PRId64 " rows add nothing. Deterministic: a counting sort of the positions\n"
        " * by row (integer atomics), each bucket ordered by position, then a block per row sums in order. */\n",
        b, V);
  cu_tx(o, "static __device__ int %s_cnt[%" PRId64 "];\n", b, V > 0 ? V : 1);
  cu_tx(o, "static __device__ int %s_off[%" PRId64 "];\n", b, V + 1);
  cu_tx(o, "static __device__ int %s_slot[%" PRId64 "];\n", b, ni > 0 ? ni : 1);
  cu_tx(o, "static __device__ int %s_pos[%" PRId64 "];\n\n", b, ni > 0 ? ni : 1);
  char name[200];
  /* s0: zero the counts */
  step_name(k, 0, 6, name, sizeof name);
  cu_signature(k, o, name);
  grid_loop(o, "v", V);
  cu_tx(o, "    %s_cnt[v] = 0;\n  }\n}\n\n", b);
  cu_add_launch(k, name, 0, "special", blocks_for(V), CU_BLOCK);
  /* s1: count */
  step_name(k, 1, 6, name, sizeof name);
  cu_signature(k, o, name);
  vocab_off(o, n->attr[0], V);
  grid_loop(o, "i", ni);
  cu_tx(o, "    const long long row = (long long)p%d[i] - off;\n", ids);
  cu_tx(o, "    if (row >= 0 && row < %" PRId64 "LL) atomicAdd(&%s_cnt[row], 1);\n  }\n}\n\n", V, b);
  cu_add_launch(k, name, 1, "special", blocks_for(ni), CU_BLOCK);
  /* s2: offsets (one block, a contiguous run of rows a thread) */
  step_name(k, 2, 6, name, sizeof name);
  cu_signature(k, o, name);
  cu_tx(o, "  __shared__ int part_[32];\n");
  cu_tx(o, "  const long long per = (%" PRId64 "LL + blockDim.x - 1) / blockDim.x;\n", V);
  cu_tx(o, "  const long long lo = (long long)threadIdx.x * per;\n");
  cu_tx(o, "  const long long hi = lo + per < %1$" PRId64 "LL ? lo + per : %1$" PRId64 "LL;\n", V);
  cu_tx(o, "  int s = 0;\n");
  cu_tx(o, "  for (long long v = lo; v < hi; v++) s += %s_cnt[v];\n", b);
  cu_tx(o, "  int total;\n  int at = hpdl_block_exscan_int(s, part_, &total);\n");
  cu_tx(o, "  for (long long v = lo; v < hi; v++) {\n");
  cu_tx(o, "    const int c = %1$s_cnt[v];\n    %1$s_off[v] = at;\n    at += c;\n", b);
  cu_tx(o, "    %s_cnt[v] = 0; /* the cursor of s3 */\n  }\n", b);
  cu_tx(o, "  if (threadIdx.x == 0) %s_off[%" PRId64 "] = total;\n}\n\n", b, V);
  cu_add_launch(k, name, 2, "special", 1, CU_BLOCK);
  /* s3: a slot of its bucket for each position */
  step_name(k, 3, 6, name, sizeof name);
  cu_signature(k, o, name);
  vocab_off(o, n->attr[0], V);
  grid_loop(o, "i", ni);
  cu_tx(o, "    const long long row = (long long)p%d[i] - off;\n", ids);
  cu_tx(o, "    if (row >= 0 && row < %1$" PRId64 "LL) %2$s_slot[%2$s_off[row] + atomicAdd(&%2$s_cnt[row], 1)] = (int)i;\n",
        V, b);
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, name, 3, "special", blocks_for(ni), CU_BLOCK);
  /* s4: each position to its place in ascending order (its rank in its bucket) */
  step_name(k, 4, 6, name, sizeof name);
  cu_signature(k, o, name);
  vocab_off(o, n->attr[0], V);
  grid_loop(o, "i", ni);
  cu_tx(o, "    const long long row = (long long)p%d[i] - off;\n", ids);
  cu_tx(o, "    if (row < 0 || row >= %" PRId64 "LL) continue;\n", V);
  cu_tx(o, "    const int lo = %1$s_off[row], hi = %1$s_off[row + 1];\n    int r = 0;\n", b);
  cu_tx(o, "    for (int j = lo; j < hi; j++) r += %s_slot[j] < (int)i;\n", b);
  cu_tx(o, "    %s_pos[lo + r] = (int)i;\n  }\n}\n\n", b);
  cu_add_launch(k, name, 4, "special", blocks_for(ni), CU_BLOCK);
  /* s5: a block per row sums its bucket in order */
  step_name(k, 5, 6, name, sizeof name);
  cu_signature(k, o, name);
  cu_tx(o, "  for (long long v = blockIdx.x; v < %" PRId64 "LL; v += gridDim.x) {\n", V);
  cu_tx(o, "    const int lo = %1$s_off[v], hi = %1$s_off[v + 1];\n", b);
  cu_tx(o, "    for (long long c = threadIdx.x; c < %" PRId64 "LL; c += blockDim.x) {\n", C);
  cu_tx(o, "      float acc = 0.0f;\n");
  cu_tx(o, "      for (int j = lo; j < hi; j++) acc += (float)p%d[(long long)%s_pos[j] * %" PRId64 "LL + c];\n", dy, b, C);
  char at[64];
  snprintf(at, sizeof at, "v * %" PRId64 "LL + c", C);
  store(o, "      ", out, n->dtype, at, "acc");
  cu_tx(o, "    }\n  }\n}\n\n");
  cu_add_launch(k, name, 5, "special", V, row_block(C));
  return 0;
}

/* The function that widens a stored value of type dt to float (a cast for fp32). */
static const char *widen(DType dt) {
  return dt == DT_BF16 ? "hpdl_bf16_to_f32" : dt == DT_F16 ? "hpdl_f16_to_f32" : "(float)";
}

/* ---- rope ---- */

static int rope(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  if (n->rank != 4 || n->dims[3] % 2) {
    cu_fail(k->t, "graph %s kernel k%d: rope needs [B, H, T, D] or [B, T, H, D] with D even", k->fg->graph->name, k->kp);
    return -1;
  }
  int xs = io_of(k, n->in[0]), out = io_of(k, id);
  if (xs < 0 || out < 0) return -1;
  const int bthd = ir_rope_bthd(n);
  int64_t H = n->dims[ir_rope_heads_axis(n)], BH = n->dims[0] * H, T = n->dims[ir_rope_pos_axis(n)], D = n->dims[3],
          H2 = D / 2;
  int64_t chunk = BH < ROPE_CHUNK ? BH : ROPE_CHUNK, nch = BH > 0 ? (BH + chunk - 1) / chunk : 0;
  char base[40];
  snprintf(base, sizeof base, "%.17g", n->fattr);
  if (!strpbrk(base, ".eEn")) strcat(base, ".0"); /* a double literal, not an int */
  cu_tx(o, "/* %s: rope%s: pairs (2i, 2i+1) of position p rotated by theta = %sp * base^(-2i/D), base %s;\n"
        " * the angle in fp64 (the CPU's table), one thread a (chunk of heads, position, pair)%s%s */\n",
        k->base, n->attr[0] ? " (inverse)" : "", n->attr[0] ? "-" : "", base,
        n->attr[1] ? "; positions of this rank's zigzag chunks" : "", bthd ? "; x as [B, T, H, D]" : "");
  cu_signature(k, o, k->base);
  grid_loop(o, "lin", nch * T * H2);
  cu_tx(o, "    const long long i = lin %% %1$" PRId64 "LL, t = lin / %1$" PRId64 "LL %% %2$" PRId64 "LL, ch = lin / %3$" PRId64
        "LL;\n",
        H2, T, T * H2);
  if (n->attr[1])
    cu_tx(o, "    const long long pos = hpdl_zigzag_pos(hpd.rank[%1$" PRId64 "], hpd.size[%1$" PRId64 "], %2$" PRId64 "LL, t);\n",
          n->attr[1] - 1, T);
  else cu_tx(o, "    const long long pos = t;\n");
  double yf, ylo, yhi;
  if (ir_rope_yarn_range(n, D, &yf, &ylo, &yhi)) {
    /* YaRN's gain on the frequency, as ir_rope_gain computes it (rounded apart) */
    cu_tx(o, "    double ramp = __ddiv_rn(__dsub_rn((double)i, %.17g), %.17g);\n", ylo, yhi - ylo);
    cu_tx(o, "    ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;\n");
    cu_tx(o, "    const double keep = 1.0 - ramp, gain = __dadd_rn(__ddiv_rn(1.0 - keep, %.17g), keep);\n", yf);
  } else {
    cu_tx(o, "    const double gain = 1.0;\n");
  }
  cu_tx(o, "    const double theta = (%s * (double)pos) * __dmul_rn(pow(%s, (-2.0 * (double)i) / %" PRId64 ".0), gain);\n",
        n->attr[0] ? "-1.0" : "1.0", base, D);
  cu_tx(o, "    const float c = (float)cos(theta), s = (float)sin(theta);\n");
  cu_tx(o, "    const long long end = ch * %1$" PRId64 "LL + %1$" PRId64 "LL < %2$" PRId64 "LL ? ch * %1$" PRId64
        "LL + %1$" PRId64 "LL : %2$" PRId64 "LL;\n",
        chunk, BH);
  cu_tx(o, "    for (long long bh = ch * %" PRId64 "LL; bh < end; bh++) {\n", chunk);
  if (bthd)
    cu_tx(o, "      const long long at = ((bh / %1$" PRId64 "LL * %2$" PRId64 "LL + t) * %1$" PRId64 "LL + bh %% %1$" PRId64
          "LL) * %3$" PRId64 "LL + 2 * i;\n",
          H, T, D);
  else cu_tx(o, "      const long long at = (bh * %" PRId64 "LL + t) * %" PRId64 "LL + 2 * i;\n", T, D);
  /* x as stored: fp32, or 16 bits (a bf16 GEMM's product, the 16-bit attention's gradient) */
  const char *wx = widen(nd(k, mem_of(k, n->in[0]))->dtype);
  cu_tx(o, "      const float x0 = %2$s(p%1$d[at]), x1 = %2$s(p%1$d[at + 1]);\n", xs, wx);
  /* products rounded apart, as the CPU's (no fused multiply-add) */
  store(o, "      ", out, n->dtype, "at", "__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s))");
  store(o, "      ", out, n->dtype, "at + 1", "__fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c))");
  cu_tx(o, "    }\n  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(nch * T * H2), CU_BLOCK);
  return 0;
}

/* ---- cross-entropy with its softmax ---- */

/* `if (vec_) {` and a loop over the row `base` of io x four logits a thread, `q` the four
 * (fp32: one float4 load; 16-bit, the logits as the GEMM stores them under bf16: one
 * 8-byte load, widened) */
static void row4_open(CuText *o, int x, int64_t V, DType dt) {
  cu_tx(o, "    if (vec_) {\n");
  cu_tx(o, "      for (long long v = threadIdx.x * 4LL; v < %" PRId64 "LL; v += blockDim.x * 4LL) {\n", V);
  if (dt == DT_F32) {
    cu_tx(o, "        const float4 q = *(const float4 *)(p%d + base + v);\n", x);
    return;
  }
  const char *w = widen(dt);
  cu_tx(o, "        const uint2 u = *(const uint2 *)(p%d + base + v);\n", x);
  cu_tx(o, "        const float4 q = make_float4(%1$s((unsigned short)(u.x & 0xffffu)), %1$s((unsigned short)(u.x >> 16)), "
           "%1$s((unsigned short)(u.y & 0xffffu)), %1$s((unsigned short)(u.y >> 16)));\n", w);
}

/* The row's max `m` and log-sum-exp `lse` (double; -inf for an all -inf
 * row) in one pass over the logits: each thread's running (max, sum of
 * exp(x - max)) (hpdl_lse_add, the online softmax), then the block's max and
 * the sum of each thread's sum rescaled to it (block reductions); lse = max +
 * log(sum) in fp64, as the CPU's row_lse. With vec4 (f32 or 16-bit logits,
 * rows a multiple of 4), four logits a thread (row4_open) where `vec_` (the
 * buffers 16-byte aligned). Every thread of the block runs it. */
static void row_lse(CuText *o, int x, int64_t V, int vec4, DType dt) {
  cu_tx(o, "    const long long base = row * %" PRId64 "LL;\n", V);
  cu_tx(o, "    float m = HPDL_NEG_INF, s = 0.0f;\n");
  if (vec4) {
    row4_open(o, x, V, dt);
    cu_tx(o, "        hpdl_lse_add(&m, &s, q.x);\n        hpdl_lse_add(&m, &s, q.y);\n");
    cu_tx(o, "        hpdl_lse_add(&m, &s, q.z);\n        hpdl_lse_add(&m, &s, q.w);\n      }\n    } else\n  ");
  }
  cu_tx(o, "    for (long long v = threadIdx.x; v < %" PRId64 "LL; v += blockDim.x) hpdl_lse_add(&m, &s, %s(p%d[base + v]));\n",
        V, widen(dt), x);
  cu_tx(o, "    const float bm = hpdl_block_max(m, red_);\n");
  cu_tx(o, "    s = hpdl_block_sum(m == HPDL_NEG_INF ? 0.0f : s * expf(m - bm), red_);\n");
  cu_tx(o, "    const double lse = bm == HPDL_NEG_INF ? (double)HPDL_NEG_INF : (double)bm + (double)logf(s);\n");
}

/* `const bool vec_ = ...;`: io buffers a, b (b < 0: none) 16-byte aligned */
static void vec_flag(CuText *o, int a, int b) {
  if (b >= 0) cu_tx(o, "  const bool vec_ = (((unsigned long long)p%d | (unsigned long long)p%d) & 15ULL) == 0;\n", a, b);
  else cu_tx(o, "  const bool vec_ = ((unsigned long long)p%d & 15ULL) == 0;\n", a);
}

/* The kernel of the cross-entropy forward whose rows' log-sum-exp the
 * backward `id` (logits x) can read instead of computing it again (a full
 * pass over the logits less): the loss of the same logits, an earlier
 * kernel of the same graph, where the graph runs whole each time (no
 * pipeline transfer: a pipeline runs a micro-batch's forward and backward
 * halves apart, other micro-batches' forwards between). -1: none. */
static int lse_kernel(const CuKern *k, int id) {
  const IrGraph *g = k->fg->graph;
  const IrNode *n = nd(k, id);
  int found = -1;
  for (int j = 0; j < g->nnodes; j++) {
    const IrNode *f = &g->nodes[j];
    if (f->op == IR_SEND || f->op == IR_RECV) return -1;
    if (f->op == IR_CROSS_ENTROPY && f->in[0] == n->in[0] && k->fg->kernel_of[j] < k->kp) found = k->fg->kernel_of[j];
  }
  return found;
}

/* A cross-entropy's (or its backward's, node n) rows: *V logits each, *P rows (its
 * targets); -1 after cu_fail where the logits are not P x V. */
static int ce_rows(CuKern *k, const IrNode *n, int64_t *V, int64_t *P) {
  const IrNode *xn = nd(k, n->in[0]);
  *V = xn->dims[xn->rank - 1];
  *P = ir_numel(nd(k, mem_of(k, n->in[1])));
  if (*V >= 1 && ir_numel(nd(k, mem_of(k, n->in[0]))) == *P * *V) return 0;
  cu_fail(k->t, "graph %s kernel k%d: %s over %" PRId64 " targets and %" PRId64 " logits", k->fg->graph->name, k->kp,
          ir_op_name(n->op), *P, ir_numel(xn));
  return -1;
}

/* The gradient of row `base` of the logits (io x, stored as xdt) into io out
 * (stored as odt): out[v] = scale * (exp(x[v] - lse32) - (v == tgt)), zeros
 * where !ok; four a thread where vec4 and `vec_`. With `loss` (the name of
 * the rows' fp64 losses) the thread that reads the target's logit writes the
 * row's loss, lse - x[tgt], before it writes that logit's gradient (which may
 * overwrite it: the memory plan may put out in x's place). Ends the row's
 * loop body (the vector path `continue`s). */
static void ce_grad_row(CuText *o, int x, int out, int64_t V, int vec4, DType xdt, DType odt, const char *loss) {
  if (vec4) {
    row4_open(o, x, V, xdt);
    if (loss)
      cu_tx(o, "        if (tgt >= v && tgt < v + 4) %s[row] = lse - (double)(tgt == v ? q.x : tgt == v + 1 ? q.y : tgt == v + 2 ? q.z : q.w);\n",
            loss);
    cu_tx(o, "        float g[4] = {expf(q.x - lse32), expf(q.y - lse32), expf(q.z - lse32), expf(q.w - lse32)};\n");
    cu_tx(o, "        for (int e = 0; e < 4; e++) g[e] = ok ? scale * (v + e == tgt ? g[e] - 1.0f : g[e]) : 0.0f;\n");
    static const char *const g4[4] = {"g[0]", "g[1]", "g[2]", "g[3]"};
    cu_store4(o, "        ", out, odt, "base + v", g4);
    cu_tx(o, "      }\n      continue;\n    }\n");
  }
  cu_tx(o, "    for (long long v = threadIdx.x; v < %" PRId64 "LL; v += blockDim.x) {\n", V);
  if (loss) {
    cu_tx(o, "      const float xv = %s(p%d[base + v]);\n", widen(xdt), x);
    cu_tx(o, "      if (v == tgt) %s[row] = lse - (double)xv;\n", loss);
    cu_tx(o, "      const float e = expf(xv - lse32);\n");
  } else {
    cu_tx(o, "      const float e = expf(%s(p%d[base + v]) - lse32);\n", widen(xdt), x);
  }
  cu_tx(o, "      const float g = ok ? scale * (v == tgt ? e - 1.0f : e) : 0.0f;\n");
  store(o, "      ", out, odt, "base + v", "g");
  cu_tx(o, "    }\n");
}

/* The loss's sum over the rows' losses `base`_loss (fp64, one block, a fixed
 * order) into io out: step `step` of `nsteps` of the kernel. */
static void ce_loss_sum(CuKern *k, int out, DType dt, int64_t P, int step, int nsteps) {
  CuText *o = &k->t->src;
  char name[200];
  step_name(k, step, nsteps, name, sizeof name);
  cu_signature(k, o, name);
  cu_tx(o, "  __shared__ double red_[32];\n");
  cu_tx(o, "  double s = 0.0;\n");
  cu_tx(o, "  for (long long p = threadIdx.x; p < %" PRId64 "LL; p += blockDim.x) s += %s_loss[p];\n", P, k->base);
  cu_tx(o, "  s = hpdl_block_sum_d(s, red_);\n");
  cu_tx(o, "  if (threadIdx.x == 0) {\n");
  cu_tx(o, "    const float mean = (float)(s / %" PRId64 ".0);\n", P);
  store(o, "    ", out, dt, "0", "mean");
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, name, step, "special", 1, row_block(P));
}

/* A cross-entropy with its backward in one kernel (fuse.c's ce_pair): s0 a
 * block per row finds the row's log-sum-exp in one pass, then writes its
 * gradient, a second read of the row (which the block has just read: from
 * L2 on a GPU), where the thread reading the target's logit writes the row's
 * loss; s1 sums the losses. The gradient may take the logits' place (the
 * memory plan's in-place pair, mem_fused_inplace_ok): each logit is read
 * and then written by one thread, after the block's reductions over the row.
 * The numbers are the two kernels' (the backward reads the forward's
 * log-sum-exp as a float). */
static int ce_pair(CuKern *k) {
  CuText *o = &k->t->src;
  const IrNode *n = NULL, *bn = NULL;
  int id = -1, bid = -1;
  for (int j = 0; j < k->K->nnodes; j++) {
    const IrNode *m = nd(k, k->K->nodes[j]);
    if (m->op == IR_CROSS_ENTROPY) n = m, id = k->K->nodes[j];
    if (m->op == IR_CROSS_ENTROPY_BWD) bn = m, bid = k->K->nodes[j];
  }
  if (!n || !bn) return -1;
  int x = io_of(k, n->in[0]), t = io_of(k, n->in[1]), loss = io_of(k, id), out = io_of(k, bid), dl = io_of(k, bn->in[2]);
  int64_t V, P;
  if (x < 0 || t < 0 || loss < 0 || out < 0 || dl < 0 || ce_rows(k, n, &V, &P)) return -1;
  const IrNode *xn = nd(k, n->in[0]);
  const char *b = k->base;
  cu_tx(o, "/* %s: cross_entropy with its backward, one pass over the logits: s0 a block per row writes the row's\n"
        " * loss (fp64) and dx[p, v] = dloss / %" PRId64 " * (softmax(x[p])[v] - (v == target[p])), s1 one block\n"
        " * sums the losses (fp64, a fixed order) into their mean; a target outside [0, %" PRId64 ") adds 0 and\n"
        " * gives its row zeros (range checks are the runtime's) */\n",
        b, P, V);
  cu_tx(o, "static __device__ double %s_loss[%" PRId64 "];\n\n", b, P > 0 ? P : 1);
  char name[200];
  step_name(k, 0, 2, name, sizeof name);
  cu_signature(k, o, name);
  cu_tx(o, "  __shared__ float red_[32];\n");
  cu_tx(o, "  const float scale = (float)p%d[0] / %" PRId64 ".0f;\n", dl, P);
  int vec4 = cu_vec_type(xn->dtype) && V % 4 == 0 && cu_vec_type(bn->dtype);
  if (vec4) vec_flag(o, x, out);
  cu_tx(o, "  for (long long row = blockIdx.x; row < %" PRId64 "LL; row += gridDim.x) {\n", P);
  row_lse(o, x, V, vec4, xn->dtype);
  cu_tx(o, "    const float lse32 = (float)lse;\n");
  cu_tx(o, "    const long long tgt = (long long)p%d[row];\n", t);
  cu_tx(o, "    const int ok = tgt >= 0 && tgt < %" PRId64 "LL;\n", V);
  cu_tx(o, "    if (!ok && threadIdx.x == 0) %s_loss[row] = 0.0;\n", b);
  char lname[200];
  snprintf(lname, sizeof lname, "%s_loss", b);
  ce_grad_row(o, x, out, V, vec4, xn->dtype, bn->dtype, lname);
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, name, 0, "special", P, row_block(V));
  ce_loss_sum(k, loss, n->dtype, P, 1, 2);
  return 0;
}

static int cross_entropy(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int bwd = n->op == IR_CROSS_ENTROPY_BWD;
  int x = io_of(k, n->in[0]), t = io_of(k, n->in[1]), out = io_of(k, id), dl = bwd ? io_of(k, n->in[2]) : 0;
  int64_t V, P;
  if (x < 0 || t < 0 || out < 0 || dl < 0 || ce_rows(k, n, &V, &P)) return -1;
  const IrNode *xn = nd(k, n->in[0]);
  const char *b = k->base;
  if (bwd) {
    cu_tx(o, "/* %s: cross_entropy_bwd: dx[p, v] = dloss / %" PRId64 " * (softmax(x[p])[v] - (v == target[p]));\n"
          " * a block per row; a target outside [0, %" PRId64 ") gives the row zeros (range checks are the runtime's) */\n",
          b, P, V);
    cu_signature(k, o, b);
    int fk = lse_kernel(k, id);
    if (fk < 0) cu_tx(o, "  __shared__ float red_[32];\n"); /* the row's log-sum-exp computed here */
    cu_tx(o, "  const float scale = (float)p%d[0] / %" PRId64 ".0f;\n", dl, P);
    /* four logits a thread where the rows allow (f32 or 16-bit in, f32 or 16-bit out) */
    int vec4 = cu_vec_type(xn->dtype) && V % 4 == 0 && cu_vec_type(n->dtype);
    if (vec4) vec_flag(o, x, out);
    char fbase[160] = "";
    if (fk >= 0) cu_kernel_base(k->fg, fk, fbase, sizeof fbase);
    cu_tx(o, "  for (long long row = blockIdx.x; row < %" PRId64 "LL; row += gridDim.x) {\n", P);
    if (fk >= 0) { /* the forward's, the same float */
      cu_tx(o, "    const long long base = row * %" PRId64 "LL;\n", V);
      cu_tx(o, "    const float lse32 = %s_lse[row]; /* kernel %d's: the loss of these logits */\n", fbase, fk);
    } else {
      row_lse(o, x, V, vec4, xn->dtype);
      cu_tx(o, "    const float lse32 = (float)lse;\n");
    }
    cu_tx(o, "    const long long tgt = (long long)p%d[row];\n", t);
    cu_tx(o, "    const int ok = tgt >= 0 && tgt < %" PRId64 "LL;\n", V);
    ce_grad_row(o, x, out, V, vec4, xn->dtype, n->dtype, NULL);
    cu_tx(o, "  }\n}\n\n");
    cu_add_launch(k, b, 0, "special", P, row_block(V));
    return 0;
  }
  cu_tx(o, "/* %s: cross_entropy: the mean over %" PRId64 " rows of logsumexp(x[p]) - x[p, target[p]]: s0 a block per\n"
        " * row writes the row's loss (fp64), s1 one block sums them (fp64, a fixed order); a target outside\n"
        " * [0, %" PRId64 ") adds 0 (range checks are the runtime's) */\n",
        b, P, V);
  cu_tx(o, "static __device__ double %s_loss[%" PRId64 "];\n", b, P > 0 ? P : 1);
  /* each row's log-sum-exp as the backward rounds it, for a backward that reads it (lse_kernel) */
  cu_tx(o, "static __device__ float %s_lse[%" PRId64 "];\n\n", b, P > 0 ? P : 1);
  char name[200];
  step_name(k, 0, 2, name, sizeof name);
  cu_signature(k, o, name);
  cu_tx(o, "  __shared__ float red_[32];\n");
  int vec4 = cu_vec_type(xn->dtype) && V % 4 == 0;
  if (vec4) vec_flag(o, x, -1);
  cu_tx(o, "  for (long long row = blockIdx.x; row < %" PRId64 "LL; row += gridDim.x) {\n", P);
  row_lse(o, x, V, vec4, xn->dtype);
  cu_tx(o, "    if (threadIdx.x == 0) {\n");
  cu_tx(o, "      %s_lse[row] = (float)lse;\n", b);
  cu_tx(o, "      const long long tgt = (long long)p%d[row];\n", t);
  cu_tx(o, "      %s_loss[row] = tgt >= 0 && tgt < %" PRId64 "LL ? lse - (double)%s(p%d[base + tgt]) : 0.0;\n", b, V,
        widen(xn->dtype), x);
  cu_tx(o, "    }\n  }\n}\n\n");
  cu_add_launch(k, name, 0, "special", P, row_block(V));
  ce_loss_sum(k, out, n->dtype, P, 1, 2);
  return 0;
}

/* ---- pick: z[p, t[p] - off] and its scatter ---- */

static int pick(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int bwd = n->op == IR_PICK_BWD;
  int z = io_of(k, n->in[0]), t = io_of(k, n->in[1]), out = io_of(k, id);
  if (z < 0 || t < 0 || out < 0) return -1;
  int64_t V = bwd ? n->dims[n->rank - 1] : nd(k, n->in[0])->dims[nd(k, n->in[0])->rank - 1];
  int64_t P = ir_numel(nd(k, mem_of(k, n->in[1])));
  if (!bwd) {
    cu_tx(o, "/* %s: pick: out[p] = z[p, t[p] - off], 0 outside this rank's %" PRId64 " columns */\n", k->base, V);
    cu_signature(k, o, k->base);
    vocab_off(o, n->attr[0], V);
    grid_loop(o, "p", P);
    cu_tx(o, "    const long long c = (long long)p%d[p] - off;\n", t);
    cu_tx(o, "    const float v = c >= 0 && c < %1$" PRId64 "LL ? (float)p%2$d[p * %1$" PRId64 "LL + c] : 0.0f;\n", V, z);
    store(o, "    ", out, n->dtype, "p", "v");
    cu_tx(o, "  }\n}\n\n");
    cu_add_launch(k, k->base, 0, "special", blocks_for(P), CU_BLOCK);
    return 0;
  }
  /* every element written once: the scattered value or zero (no separate fill) */
  cu_tx(o, "/* %s: pick_bwd: out[p, c] = dy[p] where c == t[p] - off, else 0 */\n", k->base);
  cu_signature(k, o, k->base);
  vocab_off(o, n->attr[0], V);
  grid_loop(o, "lin", P * V);
  cu_tx(o, "    const long long p = lin / %1$" PRId64 "LL, c = lin - p * %1$" PRId64 "LL;\n", V);
  cu_tx(o, "    const float v = c == (long long)p%d[p] - off ? (float)p%d[p] : 0.0f;\n", t, z);
  store(o, "    ", out, n->dtype, "lin", "v");
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(P * V), CU_BLOCK);
  return 0;
}

/* ---- repeat_kv_bwd and sum_to: gathers, an output element a thread ---- */

static int repeat_kv_bwd(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int xs = io_of(k, n->in[0]), out = io_of(k, id);
  if (xs < 0 || out < 0) return -1;
  const IrNode *x = nd(k, n->in[0]);
  int64_t rep = n->attr[0];
  if (x->rank != 4 || n->rank != 4 || rep < 1 || x->dims[1] != n->dims[1] * rep || x->dims[0] != n->dims[0] ||
      x->dims[2] * x->dims[3] != n->dims[2] * n->dims[3]) {
    cu_fail(k->t, "graph %s kernel k%d: repeat_kv_bwd needs [B, H x %" PRId64 ", T, D] -> [B, H, T, D]", k->fg->graph->name,
            k->kp, rep);
    return -1;
  }
  int64_t TD = n->dims[2] * n->dims[3], N = ir_numel(n);
  cu_tx(o, "/* %s: repeat_kv_bwd: out[b, h] = sum over r < %" PRId64 " of dy[b, h * %" PRId64
        " + r], ascending (the CPU's order) */\n",
        k->base, rep, rep);
  cu_signature(k, o, k->base);
  grid_loop(o, "lin", N);
  cu_tx(o, "    const long long bh = lin / %1$" PRId64 "LL, e = lin - bh * %1$" PRId64 "LL;\n", TD);
  cu_tx(o, "    const long long src = bh * %" PRId64 "LL + e; /* (b * Hx + h * rep) * TD + e */\n", rep * TD);
  cu_tx(o, "    float acc = 0.0f;\n");
  cu_tx(o, "    for (long long r = 0; r < %" PRId64 "LL; r++) acc += (float)p%d[src + r * %" PRId64 "LL];\n", rep, xs, TD);
  store(o, "    ", out, n->dtype, "lin", "acc");
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(N), CU_BLOCK);
  return 0;
}

/* sum_to over several axis groups (and a reduce_sum fusion could not give a
 * row, mapped as the CPU back end maps it: the output right-aligned to the
 * input, its axes of 1 reduced): each output element sums the input
 * elements that broadcast from it in ascending order, the CPU's order. */
static int sum_to(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int xs = io_of(k, n->in[0]), out = io_of(k, id);
  if (xs < 0 || out < 0) return -1;
  const IrNode *x = nd(k, n->in[0]);
  int64_t xst[IR_MAX_RANK], ost[IR_MAX_RANK], R = 1, N = ir_numel(n), s = 1;
  int red[IR_MAX_RANK];
  for (int i = x->rank - 1; i >= 0; i--) {
    xst[i] = s;
    s *= x->dims[i];
  }
  s = 1;
  for (int i = n->rank - 1; i >= 0; i--) {
    ost[i] = s;
    s *= n->dims[i];
  }
  for (int i = 0; i < x->rank; i++) {
    int kk = n->rank - x->rank + i;
    red[i] = kk < 0 || (n->dims[kk] == 1 && x->dims[i] != 1);
    if (red[i]) R *= x->dims[i];
  }
  cu_tx(o, "/* %s: %s over several axis groups: each output element sums its %" PRId64
        " inputs in ascending order */\n",
        k->base, ir_op_name(n->op), R);
  cu_signature(k, o, k->base);
  grid_loop(o, "lin", N);
  cu_tx(o, "    const long long base = 0LL");
  for (int i = 0; i < x->rank; i++) {
    int kk = n->rank - x->rank + i;
    if (red[i] || x->dims[i] == 1) continue;
    cu_tx(o, " + (lin / %" PRId64 "LL %% %" PRId64 "LL) * %" PRId64 "LL", ost[kk], n->dims[kk], xst[i]);
  }
  cu_tx(o, ";\n    float acc = 0.0f;\n");
  cu_tx(o, "    for (long long r = 0; r < %" PRId64 "LL; r++) {\n", R);
  /* the reduced axes' indices from r, the last axis fastest (ascending x) */
  cu_tx(o, "      long long q = r, at = base;\n");
  for (int i = x->rank - 1; i >= 0; i--) {
    if (!red[i]) continue;
    cu_tx(o, "      at += (q %% %" PRId64 "LL) * %" PRId64 "LL; q /= %" PRId64 "LL;\n", x->dims[i], xst[i], x->dims[i]);
  }
  /* any float type (precision.c: a column sum reads its input as stored) */
  cu_tx(o, "      acc += %s(p%d[at]);\n    }\n", widen(x->dtype), xs);
  store(o, "    ", out, n->dtype, "lin", "acc");
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(N), CU_BLOCK);
  return 0;
}

/* ---- the mixture of experts' routing (ir_ops.h; core/hostop.c's loops) ---- */

/* topk: a thread per row picks the k largest in turn (the first of equals,
 * a NaN only when nothing else is left: interp_topk's order), an earlier
 * pick found by looking back over the row's k outputs (k is small). */
static int topk(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int x = io_of(k, n->in[0]), out = io_of(k, id);
  if (x < 0 || out < 0) return -1;
  const IrNode *xn = nd(k, n->in[0]); /* a row is the value's last axis, whatever the buffer's */
  int64_t V = xn->dims[xn->rank - 1], K = n->attr[0], rows = V ? ir_numel(xn) / V : 0;
  cu_tx(o, "/* %s: topk: out[r, j] = the position of the j-th largest of x[r, :%" PRId64 "] (the first of equals) */\n",
        k->base, V);
  cu_signature(k, o, k->base);
  grid_loop(o, "r", rows);
  cu_tx(o, "    for (long long j = 0; j < %" PRId64 "LL; j++) {\n", K);
  cu_tx(o, "      long long best = -1;\n      double bv = 0.0;\n");
  cu_tx(o, "      for (long long v = 0; v < %" PRId64 "LL; v++) {\n", V);
  cu_tx(o, "        int taken = 0;\n");
  cu_tx(o, "        for (long long q = 0; q < j; q++) taken |= (long long)p%d[r * %" PRId64 "LL + q] == v;\n", out, K);
  cu_tx(o, "        const double xv = (double)p%d[r * %" PRId64 "LL + v];\n", x, V);
  cu_tx(o, "        if (!taken && (best < 0 || xv > bv || (isnan(bv) && !isnan(xv)))) { best = v; bv = xv; }\n");
  cu_tx(o, "      }\n");
  cu_tx(o, "      p%d[r * %" PRId64 "LL + j] = (%s)best;\n    }\n  }\n}\n\n", out, K, cu_c_type(n->dtype));
  cu_add_launch(k, k->base, 0, "special", blocks_for(rows), CU_BLOCK);
  return 0;
}

/* take: out[p] = x[row(p), idx[p]]; take_bwd: out[row, v] = the sum over
 * j of dy[row, j] with idx[row, j] == v, in ascending j (the CPU's order; a
 * gather: no atomics). An index out of range reads as 0 and adds nothing. */
static int take(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int bwd = n->op == IR_TAKE_BWD;
  int x = io_of(k, n->in[0]), ix = io_of(k, n->in[1]), out = io_of(k, id);
  if (x < 0 || ix < 0 || out < 0) return -1;
  const IrNode *xn = nd(k, n->in[0]), *tn = nd(k, n->in[1]);
  int64_t K = tn->dims[tn->rank - 1], V = bwd ? n->dims[n->rank - 1] : xn->dims[xn->rank - 1], P = ir_numel(tn);
  if (!bwd) {
    cu_tx(o, "/* %s: take: out[p] = x[p / %" PRId64 ", idx[p]] */\n", k->base, K);
    cu_signature(k, o, k->base);
    grid_loop(o, "p", P);
    cu_tx(o, "    const long long v = (long long)p%d[p], row = p / %" PRId64 "LL;\n", ix, K);
    cu_tx(o, "    const float r = v >= 0 && v < %1$" PRId64 "LL ? (float)p%2$d[row * %1$" PRId64 "LL + v] : 0.0f;\n", V, x);
    store(o, "    ", out, n->dtype, "p", "r");
    cu_tx(o, "  }\n}\n\n");
    cu_add_launch(k, k->base, 0, "special", blocks_for(P), CU_BLOCK);
    return 0;
  }
  int64_t N = ir_numel(n);
  cu_tx(o, "/* %s: take_bwd: out[row, v] = sum over j < %" PRId64 " with idx[row, j] == v of dy[row, j], ascending */\n",
        k->base, K);
  cu_signature(k, o, k->base);
  grid_loop(o, "lin", N);
  cu_tx(o, "    const long long row = lin / %1$" PRId64 "LL, v = lin - row * %1$" PRId64 "LL;\n", V);
  cu_tx(o, "    float acc = 0.0f;\n");
  cu_tx(o, "    for (long long j = 0; j < %1$" PRId64 "LL; j++)\n      if ((long long)p%2$d[row * %1$" PRId64
        "LL + j] == v) acc += (float)p%3$d[row * %1$" PRId64 "LL + j];\n",
        K, ix, x);
  store(o, "    ", out, n->dtype, "lin", "acc");
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(N), CU_BLOCK);
  return 0;
}

/* one_hot: out[p, c] = idx[p] == c */
static int one_hot(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int ix = io_of(k, n->in[0]), out = io_of(k, id);
  if (ix < 0 || out < 0) return -1;
  int64_t C = n->attr[0], N = ir_numel(n);
  cu_tx(o, "/* %s: one_hot: out[p, c] = 1 where idx[p] == c < %" PRId64 ", else 0 */\n", k->base, C);
  cu_signature(k, o, k->base);
  grid_loop(o, "lin", N);
  cu_tx(o, "    const long long p = lin / %1$" PRId64 "LL, c = lin - p * %1$" PRId64 "LL;\n", C);
  char v[64];
  snprintf(v, sizeof v, "(long long)p%d[p] == c ? 1.0f : 0.0f", ix);
  store(o, "    ", out, n->dtype, "lin", v);
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(N), CU_BLOCK);
  return 0;
}

/* moe_dispatch, moe_combine, moe_gate_grad: s0, a block per sequence
 * (hpdl_moe.cuh's hpdl_moe_route), takes its choices in GShard's priority
 * (every first choice in token order, then every second...) and gives each
 * the next slot of its expert while the expert has room (interp_moe_slots),
 * writing the slot of each choice and, for the dispatch, the choice of each
 * slot (-1: empty); s1
 * moves the values, an output element a thread: the dispatch copies a
 * weighted token into each slot (zeros in an empty one), the combine sums a
 * token's k weighted slots in ascending k, the gate gradient is the dot
 * product of a token with a slot, in fp64 (hostop.c's arithmetic). An
 * expert out of range takes no slot. The routing tables are static
 * __device__ scratch of the module, named after the kernel.
 * The dropless packed form (y [B T K, C], ir_ops.h) is one sequence of B T
 * tokens whose s0 counts each expert's choices, and gives choice p the row of
 * its expert's first plus the earlier choices of that expert
 * (interp_moe_rows): then a "slot" is the row. */
static int moe(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int iidx = n->op == IR_MOE_GATE_GRAD ? 2 : 1;
  int a = io_of(k, n->in[0]), ix = io_of(k, n->in[iidx]), w = io_of(k, n->in[n->op == IR_MOE_GATE_GRAD ? 1 : 2]),
      out = io_of(k, id);
  if (a < 0 || ix < 0 || w < 0 || out < 0) return -1;
  const IrNode *idxn = nd(k, n->in[iidx]);
  const IrNode *wide = n->op == IR_MOE_DISPATCH ? n : nd(k, n->in[n->op == IR_MOE_COMBINE ? 0 : 1]);
  int packed = wide->rank == 2;
  int64_t B = idxn->dims[0], T = idxn->dims[1], K = idxn->dims[2], C = wide->dims[wide->rank - 1];
  int64_t E = packed ? n->attr[0] : wide->dims[1], cap = packed ? 0 : wide->dims[2];
  if (packed) T *= B, B = 1; /* one sequence of all the tokens */
  int64_t per_seq = packed ? T * K : E * cap; /* a sequence's slots (the packed rows) */
  if (B * T * K > INT32_MAX || B * per_seq > INT32_MAX) {
    cu_fail(k->t, "graph %s kernel k%d: %s over %" PRId64 " choices and %" PRId64 " slots: the CUDA kernel counts them in 32 bits",
            k->fg->graph->name, k->kp, ir_op_name(n->op), B * T * K, B * per_seq);
    return -1;
  }
  const char *b = k->base;
  int dispatch = n->op == IR_MOE_DISPATCH;
  if (packed)
    cu_tx(o, "/* %s: %s, packed: %" PRId64 " choices (%" PRId64 " tokens, k %" PRId64 ") as rows sorted by expert of %" PRId64
          ", width %" PRId64 " */\n",
          b, ir_op_name(n->op), T * K, T, K, E, C);
  else
    cu_tx(o, "/* %s: %s: [B %" PRId64 ", T %" PRId64 ", k %" PRId64 "] choices over %" PRId64 " experts of %" PRId64
          " slots, width %" PRId64 " */\n",
          b, ir_op_name(n->op), B, T, K, E, cap, C);
  cu_tx(o, "static __device__ int %s_slot[%" PRId64 "];\n", b, B * T * K);
  if (dispatch) cu_tx(o, "static __device__ int %s_src[%" PRId64 "];\n", b, B * per_seq > 0 ? B * per_seq : 1);
  cu_tx(o, "static __device__ int %s_cnt[%" PRId64 "];\n\n", b, B * (E + 1));
  char name[200];
  step_name(k, 0, 2, name, sizeof name);
  cu_signature(k, o, name);
  cu_tx(o, "  for (long long bs = blockIdx.x; bs < %" PRId64 "LL; bs += gridDim.x)\n", B);
  cu_tx(o, "    hpdl_moe_route(p%d + bs * %" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %" PRId64 "LL, %d, %d, %s_slot + bs * %" PRId64
        "LL, ",
        ix, T * K, T, K, E, cap, !packed, packed, b, T * K);
  if (dispatch) cu_tx(o, "%s_src + bs * %" PRId64 "LL, ", b, per_seq);
  else cu_tx(o, "nullptr, ");
  cu_tx(o, "%s_cnt + bs * %" PRId64 "LL);\n}\n\n", b, E + 1);
  cu_add_launch(k, name, 0, "special", B, HPDL_MOE_THREADS);
  step_name(k, 1, 2, name, sizeof name);
  cu_signature(k, o, name);
  if (dispatch) {
    int64_t N = B * per_seq * C;
    grid_loop(o, "lin", N);
    cu_tx(o, "    const long long c = lin %% %1$" PRId64 "LL, bslot = lin / %1$" PRId64 "LL, bs = bslot / %2$" PRId64 "LL;\n", C,
          per_seq);
    cu_tx(o, "    const int p = %s_src[bslot];\n", b);
    cu_tx(o, "    float v = 0.0f;\n");
    cu_tx(o, "    if (p >= 0) v = (float)p%1$d[bs * %2$" PRId64 "LL + p] * (float)p%3$d[(bs * %4$" PRId64 "LL + p / %5$" PRId64
          "LL) * %6$" PRId64 "LL + c];\n",
          w, T * K, a, T, K, C);
    store(o, "    ", out, n->dtype, "lin", "v");
    cu_tx(o, "  }\n}\n\n");
    cu_add_launch(k, name, 1, "special", blocks_for(N), CU_BLOCK);
  } else if (n->op == IR_MOE_COMBINE) {
    int64_t N = B * T * C;
    grid_loop(o, "lin", N);
    cu_tx(o, "    const long long c = lin %% %1$" PRId64 "LL, bt = lin / %1$" PRId64 "LL, bs = bt / %2$" PRId64 "LL;\n", C, T);
    cu_tx(o, "    float acc = 0.0f;\n");
    cu_tx(o, "    for (long long kk = 0; kk < %" PRId64 "LL; kk++) {\n", K);
    cu_tx(o, "      const int s = %s_slot[bt * %" PRId64 "LL + kk];\n", b, K);
    cu_tx(o, "      if (s >= 0) { const float prod = (float)p%1$d[bt * %2$" PRId64 "LL + kk] * (float)p%3$d[(bs * %4$" PRId64
          "LL + s) * %5$" PRId64 "LL + c]; acc += prod; }\n",
          w, K, a, per_seq, C);
    cu_tx(o, "    }\n");
    store(o, "    ", out, n->dtype, "lin", "acc");
    cu_tx(o, "  }\n}\n\n");
    cu_add_launch(k, name, 1, "special", blocks_for(N), CU_BLOCK);
  } else {
    int64_t N = B * T * K;
    grid_loop(o, "q", N);
    cu_tx(o, "    const long long bs = q / %1$" PRId64 "LL, t = (q - bs * %1$" PRId64 "LL) / %2$" PRId64 "LL;\n", T * K, K);
    cu_tx(o, "    const int s = %s_slot[q];\n", b);
    cu_tx(o, "    double dot = 0.0;\n");
    cu_tx(o, "    if (s >= 0)\n      for (long long c = 0; c < %1$" PRId64 "LL; c++) dot += (double)p%2$d[(bs * %3$" PRId64
          "LL + t) * %1$" PRId64 "LL + c] * (double)p%4$d[(bs * %5$" PRId64 "LL + s) * %1$" PRId64 "LL + c];\n",
          C, a, T, w, per_seq);
    store(o, "    ", out, n->dtype, "q", "(float)dot");
    cu_tx(o, "  }\n}\n\n");
    cu_add_launch(k, name, 1, "special", blocks_for(N), CU_BLOCK);
  }
  return 0;
}

/* moe_expert_ids: the choices' experts sorted, by one block (hpdl_moe.cuh's
 * hpdl_moe_sorted: each expert's count, then each row's expert among their starts). */
static int expert_ids(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int ix = io_of(k, n->in[0]), out = io_of(k, id);
  if (ix < 0 || out < 0) return -1;
  int64_t N = n->dims[0], E = n->attr[0];
  const char *b = k->base;
  cu_tx(o, "/* %s: moe_expert_ids: %" PRId64 " choices of %" PRId64 " experts, sorted */\n", b, N, E);
  cu_tx(o, "static __device__ int %s_cnt[%" PRId64 "];\n\n", b, E + 1);
  cu_signature(k, o, b);
  cu_tx(o, "  if (blockIdx.x == 0) hpdl_moe_sorted(p%d, %" PRId64 "LL, %" PRId64 "LL, p%d, %s_cnt);\n}\n\n", ix, N, E, out, b);
  cu_add_launch(k, b, 0, "special", 1, HPDL_MOE_THREADS);
  return 0;
}

/* grouped_mm, grouped_mm_wgrad: no kernel of ours; the host program reads
 * the ids and runs one cuBLASLt GEMM an expert over its run of rows
 * (kernels.json's "grouped"; runtime/device/devexec.c). */
/* Whether node v (through a cast) is a FILL of ones. */
static int ones_fill(const CuKern *k, int v) {
  const IrGraph *g = k->fg->graph;
  const IrNode *x = &g->nodes[v];
  if (x->op == IR_CAST && x->nin == 1) x = &g->nodes[x->in[0]];
  return x->op == IR_FILL && x->fattr == 1.0;
}

/* grouped_mm of [N, 1] ones with a per-expert [E, 1, Y] value (moepack.c's bias rows):
 * each row its expert's values, a thread per element; its weight gradient, each
 * expert's [Y] the sum of its rows of dy (a thread per expert and column, its rows in
 * order: the ids are moe_expert_ids', sorted, and a binary search finds them). No
 * cuBLASLt GEMM of depth 1 an expert. */
static int expert_rows(CuKern *k, const IrNode *n, int id, int wgrad) {
  CuText *o = &k->t->src;
  int bw = io_of(k, n->in[1]), ids = io_of(k, n->in[2]), out = io_of(k, id);
  if (bw < 0 || ids < 0 || out < 0) return -1;
  const IrNode *bn = nd(k, n->in[1]);
  int64_t N = n->op == IR_GROUPED_MM ? n->dims[0] : bn->dims[0], Y = wgrad ? bn->dims[1] : n->dims[1];
  int64_t E = wgrad ? n->dims[0] : bn->dims[0];
  cu_tx(o, "/* %s: %s of ones: %s, %" PRId64 " rows of %" PRId64 " experts, %" PRId64 " columns */\n", k->base, ir_op_name(n->op),
        wgrad ? "each expert's rows of dy summed" : "each row its expert's values", N, E, Y);
  cu_signature(k, o, k->base);
  char v[160];
  if (!wgrad) {
    grid_loop(o, "lin", N * Y);
    cu_tx(o, "    const long long r = lin / %1$" PRId64 "LL, y = lin - r * %1$" PRId64 "LL;\n", Y);
    cu_tx(o, "    const int e = p%d[r];\n", ids);
    snprintf(v, sizeof v, "e >= 0 && e < %" PRId64 " ? %s(p%d[(long long)e * %" PRId64 "LL + y]) : 0.0f", E, widen(bn->dtype), bw,
             Y);
    store(o, "    ", out, n->dtype, "lin", v);
    cu_tx(o, "  }\n}\n\n");
    cu_add_launch(k, k->base, 0, "special", blocks_for(N * Y), CU_BLOCK);
    return 0;
  }
  grid_loop(o, "lin", E * Y);
  cu_tx(o, "    const long long e = lin / %1$" PRId64 "LL, y = lin - e * %1$" PRId64 "LL;\n", Y);
  /* the first row of expert e in the sorted ids, then its rows in order */
  cu_tx(o, "    long long lo = 0, hi = %" PRId64 "LL;\n", N);
  cu_tx(o, "    while (lo < hi) { const long long mid = (lo + hi) / 2; if (p%d[mid] < e) lo = mid + 1; else hi = mid; }\n", ids);
  cu_tx(o, "    float acc = 0.0f;\n");
  cu_tx(o, "    for (long long r = lo; r < %" PRId64 "LL && p%d[r] == e; r++) acc += %s(p%d[r * %" PRId64 "LL + y]);\n", N, ids,
        widen(bn->dtype), bw, Y);
  store(o, "    ", out, n->dtype, "lin", "acc");
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(E * Y), CU_BLOCK);
  return 0;
}

static int grouped(CuKern *k, const IrNode *n, int id) {
  CgTarget *t = k->t;
  const IrGraph *g = k->fg->graph;
  int a = io_of(k, n->in[0]), bw = io_of(k, n->in[1]), ids = io_of(k, n->in[2]), out = io_of(k, id);
  if (a < 0 || bw < 0 || ids < 0 || out < 0) return -1;
  const IrNode *an = &g->nodes[mem_of(k, n->in[0])], *bn = &g->nodes[mem_of(k, n->in[1])];
  int wgrad = n->op == IR_GROUPED_MM_WGRAD, tb = !wgrad && n->attr[0] != 0;
  int64_t N = an->dims[0], X = an->dims[1];
  /* a per-expert bias's rows and gradient (ones of depth 1, the ids sorted) */
  if (X == 1 && ones_fill(k, mem_of(k, n->in[0])) && (!wgrad || g->nodes[mem_of(k, n->in[2])].op == IR_MOE_EXPERT_IDS))
    return expert_rows(k, n, id, wgrad);
  char name[200];
  snprintf(name, sizeof name, "%s_grouped", k->base);
  if (an->dtype != bn->dtype || (an->dtype != DT_F32 && an->dtype != DT_BF16) || n->dtype != DT_F32) {
    cu_fail(t, "%s: %s of %s and %s into %s: the grouped GEMMs multiply fp32 or bf16 operands into fp32", name, ir_op_name(n->op),
            sem_dtype_name(an->dtype), sem_dtype_name(bn->dtype), sem_dtype_name(n->dtype));
    return -1;
  }
  cu_tx(&t->src, "/* %s: %s: cuBLASLt, one GEMM an expert over its rows (of %" PRId64 ") */\n\n", name, ir_op_name(n->op), N);
  cu_add_launch(k, name, 0, "grouped", 0, 0);
  CuLaunch *l = &t->launch[t->nlaunch - 1];
  t->stats.kernels--; /* not a kernel of ours */
  l->grid = l->block = 0;
  l->grouped = wgrad ? 2 : 1;
  l->grouped_ids = ids;
  l->gemm_a = a;
  l->gemm_b = bw;
  l->gemm_c = out;
  l->ab_bf16 = an->dtype == DT_BF16;
  l->alpha = 1.0;
  l->batch = 1;
  l->bias = l->aux = -1;
  if (wgrad) { /* C [X, Y] of expert e = A[rows]^T dY[rows] */
    int64_t Y = bn->dims[1];
    l->experts = n->dims[0];
    l->trans_a = 1, l->trans_b = 0;
    l->m = X, l->n = Y, l->k = N;
    l->lda = X, l->ldb = Y, l->ldc = Y;
  } else { /* C[rows, Y] = A[rows] op(W_e) */
    int64_t Y = n->dims[1];
    l->experts = bn->dims[0];
    l->trans_a = 0, l->trans_b = tb;
    l->m = N, l->n = Y, l->k = X;
    l->lda = X, l->ldb = tb ? X : Y, l->ldc = Y;
  }
  t->ngemm++;
  if (t->opt.emulate)
    cu_tx(&k->stub, "  hpdl_emu_grouped(io[%d], io[%d], (const int *)io[%d], (float *)io[%d], %d, %d, %d, %" PRId64 ", %" PRId64
                    ", %" PRId64 ", %" PRId64 ");\n",
          a, bw, ids, out, l->ab_bf16, wgrad, tb, N, X, wgrad ? bn->dims[1] : n->dims[1], l->experts);
  return 0;
}

/* attn_merge (ir_ops.h): ring attention's blocks merged by their log-sum-exp,
 * a thread an element of the packed output (its row's c lse values again:
 * c is small), the terms summed in blocks' order as core/numeric/attn.c's
 * attn_merge. */
static int attn_merge_kernel(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int out = io_of(k, id), c = n->nin;
  if (out < 0) return -1;
  int *in = malloc(sizeof(int) * (size_t)c);
  if (!in) {
    cu_fail(k->t, "out of memory");
    return -1;
  }
  for (int s = 0; s < c; s++)
    if ((in[s] = io_of(k, n->in[s])) < 0 || nd(k, n->in[s])->dtype != DT_F32) {
      if (in[s] >= 0) cu_fail(k->t, "graph %s kernel k%d: attn_merge merges f32 outputs", k->fg->graph->name, k->kp);
      free(in);
      return -1;
    }
  int64_t N = ir_numel(n), W = n->dims[3];
  cu_tx(o, "/* %s: attn_merge of %d ring blocks: lse = log sum exp lse_s, o = sum exp(lse_s - lse) o_s */\n", k->base, c);
  cu_signature(k, o, k->base);
  grid_loop(o, "lin", N);
  cu_tx(o, "    const long long row = lin / %1$" PRId64 "LL, j = lin - row * %1$" PRId64 "LL, l = row * %1$" PRId64 "LL + %2$" PRId64
           "LL;\n", W, W - 1);
  cu_tx(o, "    float m = HPDL_NEG_INF;\n");
  for (int s = 0; s < c; s++) cu_tx(o, "    const float l%d = p%d[l];\n    m = fmaxf(m, l%d);\n", s, in[s], s);
  cu_tx(o, "    float v = j == %" PRId64 "LL ? HPDL_NEG_INF : 0.0f;\n", W - 1);
  cu_tx(o, "    if (m != HPDL_NEG_INF) {\n      float sum = 0.0f;\n");
  for (int s = 0; s < c; s++) cu_tx(o, "      sum += expf(l%d - m);\n", s);
  cu_tx(o, "      const float lse = m + logf(sum);\n      if (j == %" PRId64 "LL) v = lse;\n      else {\n        v = 0.0f;\n", W - 1);
  for (int s = 0; s < c; s++) cu_tx(o, "        v += expf(l%d - lse) * p%d[lin];\n", s, in[s]);
  cu_tx(o, "      }\n    }\n");
  store(o, "    ", out, n->dtype, "lin", "v");
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(N), CU_BLOCK);
  free(in);
  return 0;
}

/* aux_loss: its first input passes through (a copy; the host program adds
 * weight x loss to the step's auxiliary loss, kernels.json's "aux_node"). */
static int aux_loss(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int x = io_of(k, n->in[0]), out = io_of(k, id);
  if (x < 0 || out < 0) return -1;
  int64_t N = ir_numel(n);
  cu_tx(o, "/* %s: aux_loss: out = x (the loss %%%d, weight %g, is the host program's) */\n", k->base, n->in[1], n->fattr);
  cu_signature(k, o, k->base);
  grid_loop(o, "lin", N);
  char v[32];
  snprintf(v, sizeof v, "(float)p%d[lin]", x);
  store(o, "    ", out, n->dtype, "lin", v);
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(N), CU_BLOCK);
  return 0;
}

/* state_update: out = x; in a forward (not a backward's recomputation:
 * hostop_aux_counted, decided here once) also the state parameter's buffer
 * = value, a grid-stride loop over the longer of the two. */
static int state_update(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int x = io_of(k, n->in[0]), v = io_of(k, n->in[1]), p = io_of(k, n->in[2]), out = io_of(k, id);
  if (x < 0 || v < 0 || p < 0 || out < 0) return -1;
  int counted = hostop_aux_counted(k->fg->graph, id);
  int64_t N = ir_numel(n), M = ir_numel(nd(k, n->in[1])), L = N > M ? N : M;
  if (counted) cu_tx(o, "/* %s: state_update: out = x; the running statistic %%%d = the value %%%d */\n", k->base, n->in[2], n->in[1]);
  else cu_tx(o, "/* %s: state_update: out = x (a recomputation: the state stays) */\n", k->base);
  cu_signature(k, o, k->base);
  grid_loop(o, "lin", L);
  char val[32];
  snprintf(val, sizeof val, "(float)p%d[lin]", x);
  cu_tx(o, "    if (lin < %" PRId64 ") {\n", N);
  store(o, "      ", out, n->dtype, "lin", val);
  cu_tx(o, "    }\n");
  if (counted) {
    /* the state is an input of the kernel (const in the signature) that this
     * kernel alone writes and never reads */
    if (nd(k, n->in[2])->dtype != DT_F32 || nd(k, n->in[1])->dtype != DT_F32) {
      cu_fail(k->t, "graph %s kernel k%d: a running statistic of %s (the CUDA target keeps them in f32)", k->fg->graph->name, k->kp,
              sem_dtype_name(nd(k, n->in[2])->dtype));
      return -1;
    }
    cu_tx(o, "    if (lin < %" PRId64 ") ((float *)p%d)[lin] = p%d[lin];\n", M, p, v);
  }
  cu_tx(o, "  }\n}\n\n");
  cu_add_launch(k, k->base, 0, "special", blocks_for(L), CU_BLOCK);
  return 0;
}

/* ---- attention: kernels/hpdl_attention.cuh ---- */

/* The position arguments of a context-parallel layout (ir_ops.h: attr 1 the
 * rows' group, attr 2 the keys'): this rank's index and the group's size
 * from the kernel context, or a plain layout. */
static int attn_positions(CuKern *k, const IrNode *n, int64_t S, char *buf, size_t len) {
  char part[2][96];
  int64_t one_block = 0;
  for (int a = 0; a < 2; a++) {
    int64_t g = n->attr[1 + a] - 1;
    if (g >= 4) {
      cu_fail(k->t, "graph %s kernel k%d: attention's positions over group %s, which hpdl_kctx does not carry",
              k->fg->graph->name, k->kp, ir_group_name((IrGroup)g));
      return -1;
    }
    if (g >= 0 && a == 1 && n->attr[4] > 0) { /* one ring block, received at step attr[4] - 1 (ir_ops.h) */
      snprintf(part[a], sizeof part[a], "(hpd.rank[%1$" PRId64 "] + hpd.size[%1$" PRId64 "] - %2$" PRId64 ") %% hpd.size[%1$" PRId64
               "], hpd.size[%1$" PRId64 "]", g, n->attr[4] - 1);
      one_block = 1 + g;
    } else if (g >= 0) {
      snprintf(part[a], sizeof part[a], "hpd.rank[%" PRId64 "], hpd.size[%" PRId64 "]", g, g);
    } else {
      snprintf(part[a], sizeof part[a], "0, 1");
    }
  }
  /* the span the keys' positions refer to (hpdl_attn_colpos): S, or S x c for one block */
  if (one_block) snprintf(buf, len, "%s, %s, %" PRId64 " * hpd.size[%" PRId64 "]", part[0], part[1], S, one_block - 1);
  else snprintf(buf, len, "%s, %s, %" PRId64, part[0], part[1], S);
  return 0;
}


/* The SIMT kernels: one block a multiprocessor at least, which leaves ptxas free (no
 * spill at any head size); the tensor-core kernels: their 128 threads and
 * HPDL_ATTN_TC_MIN_BLOCKS blocks, so that registers do not cap the occupancy below what
 * their shared memory allows (ncu on an H200: at 149 registers three blocks, 12 warps a
 * multiprocessor, stalled on shared-memory loads); the 16-bit ones over heads of 64
 * fewer (HPDL_ATTN_H16_MIN_BLOCKS: dkdv two, for its 128 floats of dk and dv accumulators
 * a lane at 128; the forward and dq three). kind: 0 forward, 1 dkdv, 2 dq. */
static void attn_signature(CuKern *k, CuText *o, const char *name, const hpdl_attn_launch *L, int kind, int64_t D,
                           int64_t Dv) {
  if (L->tc == 2) cu_signature_bounds(k, o, name, HPDL_ATTN_TC_THREADS, HPDL_ATTN_H16_MIN_BLOCKS(kind, D, Dv));
  else if (L->tc) cu_signature_bounds(k, o, name, HPDL_ATTN_TC_THREADS, HPDL_ATTN_TC_MIN_BLOCKS);
  else cu_signature_min(k, o, name, 1);
}

/* The tensor-core kernels (mma.sync, sm_80 on; arch NULL: sm_80, --arch's
 * default) for these heads: under 16-bit activations (h16) the ones with
 * 16-bit operands, which read q, k, v as stored (precision.h), else TF32. */
int cg_cuda_attention_tc(const char *arch, int64_t D, int64_t Dv, int h16) {
  if (!arch) arch = "sm_80";
  return !strncmp(arch, "sm_", 3) && atoi(arch + 3) >= 80 && (h16 ? HPDL_ATTN_TC16(D, Dv) : HPDL_ATTN_TC(D, Dv));
}

static int attention_tc_of(int64_t D, int64_t Dv, void *arch) { return cg_cuda_attention_tc((const char *)arch, D, Dv, 1); }

PrecTarget cg_cuda_prec_target(const char *arch) {
  PrecTarget t = {1, attention_tc_of, (void *)arch};
  return t;
}

/* The cast of fuse_attn_out16's chain (o sliced, its heads merged, cast to 16 bits)
 * where it joined the kernel of attention `id` (the kernel then writes o as the
 * projection reads it), or -1. */
static int attn_out16_cast(const CuKern *k, int id) {
  int cast = -1;
  for (int j = 0; j < k->K->nnodes; j++)
    if (nd(k, k->K->nodes[j])->op == IR_CAST && fuse_attn_out16(k->fg->graph, k->K->nodes[j]) == id)
      cast = k->K->nodes[j];
  return cast;
}

static int attention(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int bwd = n->op == IR_ATTENTION_BWD, nin = bwd ? 5 : 3, io[6];
  /* the output's gradient as the projection made it, [B, T, H, Dv] (fuse_attn_dout's
   * transpose and pad in this kernel): read through its strides, its dlse zero */
  int dout_src = -1;
  if (bwd && fuse_attn_dout(k->fg->graph, n->in[4]) == id && k->fg->kernel_of[n->in[4]] == k->kp)
    dout_src = nd(k, n->in[4])->in[0]; /* the transpose */
  /* q, k, v as the projections made them, [B, T, H, D] (fuse_attn_qkv's transposes in
   * this kernel): read through their strides */
  int qkv_bthd = 0;
  for (int i = 0; i < 3; i++)
    qkv_bthd += fuse_attn_qkv(k->fg->graph, n->in[i]) == id && k->fg->kernel_of[n->in[i]] == k->kp;
  if (qkv_bthd && qkv_bthd != 3) {
    cu_fail(k->t, "graph %s kernel k%d: %d of the attention's q, k, v transposes joined", k->fg->graph->name, k->kp, qkv_bthd);
    return -1;
  }
  for (int i = 0; i < nin; i++) {
    int v = i == 4 && dout_src >= 0 ? nd(k, dout_src)->in[0] : i < 3 && qkv_bthd ? nd(k, n->in[i])->in[0] : n->in[i];
    if ((io[i] = io_of(k, v)) < 0) return -1;
  }
  /* the gradient's 16-bit cast, joined by fuse.c's store16: [dq, dk, dv] stored in
   * q's type by the kernels themselves */
  int grad16 = -1;
  for (int j = 0; bwd && j < k->K->nnodes; j++)
    if (nd(k, k->K->nodes[j])->op == IR_CAST && nd(k, k->K->nodes[j])->in[0] == id) grad16 = k->K->nodes[j];
  /* ... and, where fuse_attn_grad16's chain joined too, dq, dk and dv written apart as
   * the projections read them ([B, T, H, D]): the flat gradient is no output then */
  int bthd[3] = {-1, -1, -1}, chain = 0;
  for (int j = 0; bwd && grad16 >= 0 && j < k->K->nnodes; j++) {
    int t = k->K->nodes[j];
    if (nd(k, t)->op != IR_TRANSPOSE || fuse_attn_grad16(k->fg->graph, t) != id) continue;
    const IrNode *sl = nd(k, nd(k, nd(k, t)->in[0])->in[0]); /* transpose <- reshape <- slice */
    int64_t nq = ir_numel(nd(k, n->in[0])), nk = ir_numel(nd(k, n->in[1]));
    int part = sl->attr[0] == 0 ? 0 : sl->attr[0] == nq ? 1 : sl->attr[0] == nq + nk ? 2 : -1;
    if (part < 0 || (bthd[part] = io_of(k, t)) < 0) return -1;
    chain++;
  }
  if (chain && chain != 3) {
    cu_fail(k->t, "graph %s kernel k%d: %d of the attention gradient's three parts joined", k->fg->graph->name, k->kp, chain);
    return -1;
  }
  /* the forward's o in 16 bits as the projection reads it, where that chain joined */
  int out16 = bwd ? -1 : attn_out16_cast(k, id);
  if (chain) io[nin] = -1; /* no flat gradient */
  else if (out16 >= 0 && cu_io_index(k, mem_of(k, id)) < 0)
    io[nin] = -1; /* the packed [o, lse] read by no other kernel (a forward that keeps
                   * nothing for its backward: full recomputation): o in 16 bits only */
  else if ((io[nin] = io_of(k, grad16 >= 0 ? grad16 : id)) < 0) return -1;
  const IrNode *q = nd(k, n->in[0]), *kk = nd(k, n->in[1]), *v = nd(k, n->in[2]);
  int64_t B = q->dims[0], H = q->dims[1], T = q->dims[2], D = q->dims[3], Hk = kk->dims[1], S = kk->dims[2], Dv = v->dims[3];
  /* the tensor-core kernels where the heads and the GPU (sm_80 on: mma.sync) allow */
  /* q, k, v in fp32, or (precision.h, for the tensor-core kernels) all three in one
   * 16-bit type as stored: then the kernels whose operands are 16-bit (mma m16n8k16
   * in that type: q, k, v exact; P, dS and the output's gradient, an fp32 GEMM's
   * product, rounded to it, as FlashAttention-2 holds them); everything else fp32 */
  DType stored = q->dtype;
  int want16 = stored == DT_BF16 || stored == DT_F16;
  hpdl_attn_launch L;
  memset(&L, 0, sizeof L);
  int tc = cg_cuda_attention_tc(k->t->opt.arch, D, Dv, want16) &&
           !hpdl_attn_plan_tc((int)D, (int)Dv, want16, B, H, Hk, T, S, &L);
  int h16 = tc && want16;
  if (qkv_bthd && !h16) {
    cu_fail(k->t, "graph %s kernel k%d: the attention's q, k, v in the projections' layout need the 16-bit tensor-core kernels",
            k->fg->graph->name, k->kp);
    return -1;
  }
  for (int i = 0; i <= nin - (chain > 0); i++) {
    const IrNode *x = i < nin ? nd(k, n->in[i]) : nd(k, grad16 >= 0 ? grad16 : id);
    if (x->dtype != ((i < 3 || (i == nin && grad16 >= 0)) && h16 ? stored : DT_F32)) {
      cu_fail(k->t, "graph %s kernel k%d: attention runs on f32 tensors (q, k, v: all three %s), not %s",
              k->fg->graph->name, k->kp, h16 ? sem_dtype_name(stored) : "f32", sem_dtype_name(x->dtype));
      return -1;
    }
  }
  if (!tc && (D > HPDL_ATTN_MAX_HEAD || Dv > HPDL_ATTN_MAX_HEAD || hpdl_attn_plan((int)D, (int)Dv, B, H, Hk, T, S, &L))) {
    cu_fail(k->t,
            "graph %s kernel k%d: no attention kernel for heads of %" PRId64 " / %" PRId64
            " (kernels/hpdl_attention.cuh takes 1 .. %d) over [%" PRId64 ", %" PRId64 ", %" PRId64 "]",
            k->fg->graph->name, k->kp, D, Dv, HPDL_ATTN_MAX_HEAD, B, H, T);
    return -1;
  }
  char pos[360], args[600];
  if (attn_positions(k, n, S, pos, sizeof pos)) return -1;
  CuText sc = {0};
  cu_float(&sc, n->fattr);
  /* the TF32 tensor-core kernels take one more argument: 3xTF32 unless the device
   * allows TF32 */
  snprintf(args, sizeof args, "%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %s, %d, %" PRId64 ", %s%s", B, H,
           Hk, T, S, sc.s ? sc.s : "1.0f", n->attr[0] ? 1 : 0, n->attr[3], pos,
           !tc || h16 ? "" : ", !(hpd.flags & HPDL_KCTX_TF32)");
  char tmpl[80];
  snprintf(tmpl, sizeof tmpl, "%" PRId64 ", %" PRId64 "%s", D, Dv, !h16 ? "" : stored == DT_BF16 ? ", 0 /* bf16 */" : ", 1 /* fp16 */");
  const char *sfx = h16 ? "_h" : tc ? "_tc" : "";
  free(sc.s);
  /* a launch's grid is capped (CU_MAX_GRID): each block walks the blocks of
   * the rule's grid, block-uniformly, so the kernels' barriers hold; one
   * block a multiprocessor at least (their shared memory allows few more),
   * so ptxas keeps every value in registers (no spill at any head size) */
  const char *b = k->base;
  char name[200];
  double flops = ircost_node(k->t->m, k->fg->graph, id).flops;
  if (!bwd) {
    /* o as the projection reads it, [B, T, H, Dv] in 16 bits (fuse_attn_out16's cast,
     * joined by store16), written beside the packed output or, where no kernel reads
     * that, alone (io[3] < 0) */
    char o16[32] = "";
    if (out16 >= 0) {
      int x = io_of(k, out16);
      if (x < 0) return -1;
      if (!h16) {
        cu_fail(k->t, "graph %s kernel k%d: the attention's 16-bit output needs the 16-bit tensor-core kernels",
                k->fg->graph->name, k->kp);
        return -1;
      }
      snprintf(o16, sizeof o16, ", p%d", x);
    }
    cu_tx(o,
          "/* %s: attention (flash, kernels/hpdl_attention.cuh%s): [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
          "] over %" PRId64 " keys of %" PRId64 " heads%s%s, packed [o, lse]%s */\n",
          b, h16 ? ", tensor cores, 16-bit operands" : tc ? ", tensor cores" : "", B, H, T, D, S, Hk,
          n->attr[0] ? ", causal" : "", qkv_bthd ? ", q, k, v read as [B, T, H, D]" : "",
          out16 >= 0 ? ", and o as [B, T, H, Dv] in 16 bits" : "");
    attn_signature(k, o, b, &L, 0, D, Dv);
    cu_tx(o, "  for (long long blk = blockIdx.x; blk < %lldLL; blk += gridDim.x)\n", L.grid_fwd);
    char packed[24] = "(float *)nullptr"; /* o in 16 bits only (io[3] < 0) */
    if (io[3] >= 0) snprintf(packed, sizeof packed, "p%d", io[3]);
    cu_tx(o, "    hpdl_attn_fwd%s<%s%s>(p%d, p%d, p%d, %s, %s, blk%s);\n}\n\n", sfx, tmpl, qkv_bthd ? ", HPDL_ATTN_QKV_BTHD" : "",
          io[0], io[1], io[2], packed, args, o16);
    cu_add_launch(k, b, 0, "attention", L.grid_fwd, L.threads);
    k->t->launch[k->t->nlaunch - 1].flops = flops;
    return 0;
  }
  cu_tx(o,
        "/* %s: attention_bwd (flash, kernels/hpdl_attention.cuh): s0 D = dO . o - dlse a row into scratch,\n"
        " * s1 dk and dv a block per tile of keys, s2 dq a block per tile of query rows; %s%s */\n",
        b, chain ? "dq, dk, dv apart, each [B, T, H, D] in 16 bits" : "one flat [dq, dk, dv]",
        qkv_bthd ? "; q, k, v read as [B, T, H, D]" : "");
  if ((chain || dout_src >= 0) && !h16) {
    cu_fail(k->t, "graph %s kernel k%d: the attention gradient's 16-bit layout needs the 16-bit tensor-core kernels",
            k->fg->graph->name, k->kp);
    return -1;
  }
  cu_tx(o, "static __device__ float %s_dt[%lld];\n\n", b, L.scratch_floats > 0 ? L.scratch_floats : 1);
  step_name(k, 0, 3, name, sizeof name);
  cu_signature_min(k, o, name, 1);
  cu_tx(o, "  for (long long blk = blockIdx.x; blk < %lldLL; blk += gridDim.x)\n", L.grid_dt);
  char dt_flags[96] = ""; /* dO as the projection made it: the layout flag after the threads */
  if (dout_src >= 0)
    snprintf(dt_flags, sizeof dt_flags, ", HPDL_ATTN_THREADS(%" PRId64 ", %" PRId64 "), HPDL_ATTN_DOUT_BTHD", D, Dv);
  cu_tx(o, "    hpdl_attn_bwd_dt<%" PRId64 ", %" PRId64 "%s>(p%d, p%d, %s_dt, %" PRId64 ", %" PRId64 ", %" PRId64 ", blk);\n}\n\n",
        D, Dv, dt_flags, io[3], io[4], b, B, H, T);
  cu_add_launch(k, name, 0, "special", L.grid_dt, HPDL_ATTN_THREADS(D, Dv)); /* a row's dot product: memory-bound */
  static const char *const fn[2] = {"hpdl_attn_bwd_dkdv", "hpdl_attn_bwd_dq"};
  long long grid[2] = {L.grid_dkdv, L.grid_dq};
  for (int s = 0; s < 2; s++) {
    step_name(k, 1 + s, 3, name, sizeof name);
    attn_signature(k, o, name, &L, 1 + s, D, Dv);
    char grads[32], apart[48] = "", flags[96] = "";
    if (chain) {
      snprintf(grads, sizeof grads, "(unsigned short *)nullptr");
      if (s == 0) snprintf(apart, sizeof apart, ", p%d, p%d", bthd[1], bthd[2]);
      else snprintf(apart, sizeof apart, ", p%d", bthd[0]);
    } else {
      snprintf(grads, sizeof grads, "p%d", io[5]);
    }
    /* the 16-bit kernels' layout flags (kernels/hpdl_attention.cuh), ", A | B ..." */
    const char *const fname[3] = {"HPDL_ATTN_GRADS_BTHD", "HPDL_ATTN_DOUT_BTHD", "HPDL_ATTN_QKV_BTHD"};
    const int fon[3] = {chain > 0, dout_src >= 0, qkv_bthd > 0};
    size_t fl = 0;
    for (int f = 0; f < 3; f++)
      if (fon[f]) fl += (size_t)snprintf(flags + fl, sizeof flags - fl, "%s%s", fl ? " | " : ", ", fname[f]);
    cu_tx(o, "  for (long long blk = blockIdx.x; blk < %lldLL; blk += gridDim.x)\n", grid[s]);
    cu_tx(o, "    %s%s<%s%s>(p%d, p%d, p%d, p%d, p%d, %s_dt, %s, %s, blk%s);\n}\n\n", fn[s], sfx, tmpl, flags, io[0], io[1],
          io[2], io[3], io[4], b, grads, args, apart);
    cu_add_launch(k, name, 1 + s, "attention", grid[s], L.threads);
    /* dk, dv recompute P and dS and take three of the five products, dq two */
    k->t->launch[k->t->nlaunch - 1].flops = flops * (s == 0 ? 0.6 : 0.4);
  }
  return 0;
}

/* ---- the fused head and loss: kernels/hpdl_lmce.cuh ---- */

/* LINEAR_CE, LINEAR_LSE or their gradients; a gradient pair (fuse.h's rule 6:
 * dx and dw of the same inputs) is one kernel, whose launches make both. */
static int linear_ce(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  const IrGraph *g = k->fg->graph;
  const FuseKernel *K = k->K;
  int dxn = -1, dwn = -1;
  for (int j = 0; j < K->nnodes; j++) {
    IrLinearRole r = ir_linear_role(g->nodes[K->nodes[j]].op);
    if (r == IR_LINEAR_DX) dxn = K->nodes[j];
    if (r == IR_LINEAR_DW) dwn = K->nodes[j];
  }
  IrLinearRole role = ir_linear_role(n->op);
  int ce = ir_linear_targets(n->op), nin = n->nin, io[6];
  for (int i = 0; i < nin; i++)
    if ((io[i] = io_of(k, n->in[i])) < 0) return -1;
  int out = role == IR_LINEAR_ROWS ? io_of(k, id) : 0, dx = dxn >= 0 ? io_of(k, dxn) : 0, dw = dwn >= 0 ? io_of(k, dwn) : 0;
  if (out < 0 || dx < 0 || dw < 0) return -1;
  const IrNode *x = nd(k, mem_of(k, n->in[0])), *w = nd(k, mem_of(k, n->in[1]));
  int bf16 = x->dtype == DT_BF16 && w->dtype == DT_BF16;
  const char *why = NULL;
  if (!bf16 && (x->dtype != DT_F32 || w->dtype != DT_F32)) why = "x and w both f32 or both bf16";
  else if (ce && nd(k, mem_of(k, n->in[2]))->dtype != DT_I32) why = "int32 targets";
  for (int i = ce ? 3 : 2; i < nin && !why; i++)
    if (nd(k, mem_of(k, n->in[i]))->dtype != DT_F32) why = "f32 rows (the forward's values and their gradient)";
  if (why) {
    cu_fail(k->t, "graph %s kernel k%d: %s takes %s", g->name, k->kp, ir_op_name(n->op), why);
    return -1;
  }
  int rows_w = n->attr[0] != 0;
  int64_t C = x->dims[x->rank - 1], Vw = w->dims[rows_w ? 0 : 1], P = ir_numel(x) / C;
  hpdl_lmce_launch L;
  hpdl_lmce_plan(P, Vw, &L);
  if (C > 0x7fffffff || P < 1 || Vw < 1) {
    cu_fail(k->t, "graph %s kernel k%d: %s over %" PRId64 " rows of %" PRId64 " and a vocabulary of %" PRId64, g->name, k->kp,
            ir_op_name(n->op), P, C, Vw);
    return -1;
  }
  const char *tx = bf16 ? "unsigned short" : "float", *b = k->base;
  char tgt[32] = "(const int *)nullptr";
  if (ce) snprintf(tgt, sizeof tgt, "p%d", io[2]);
  /* the shape: V is the vocabulary's columns before a padded shard's padding (linear_lse) */
  char shape[400];
  int64_t group = ce ? 0 : n->attr[1];
  if (group > 4) {
    cu_fail(k->t, "graph %s kernel k%d: %s's vocabulary over group %s, which hpdl_kctx does not carry", g->name, k->kp,
            ir_op_name(n->op), ir_group_name((IrGroup)(group - 1)));
    return -1;
  }
  double flops = ircost_node(k->t->m, g, id).flops;
  if (dxn >= 0 && dwn >= 0) flops = ircost_node(k->t->m, g, dxn).flops + ircost_node(k->t->m, g, dwn).flops;
  /* the vocabulary's valid columns: before the padding (ir_vocab_prefix), from this rank's first row */
  char valid[200], first[80] = "0LL";
  if (group) snprintf(first, sizeof first, "(long long)hpd.rank[%" PRId64 "] * %" PRId64 "LL", group - 1, Vw);
  if (ce || n->attr[2] <= 0) snprintf(valid, sizeof valid, "%" PRId64 "LL", Vw);
  else snprintf(valid, sizeof valid, "hpdl_lmce_prefix(%" PRId64 "LL, %s, %" PRId64 "LL)", n->attr[2], first, Vw);
  snprintf(shape, sizeof shape, "  const hpdl_lmce_shape s = {%" PRId64 "LL, %" PRId64 "LL, %s, %" PRId64 "LL, %" PRId64 "LL, %d, %d, %d};\n",
           P, C, valid, Vw, Vw, rows_w, L.splits, bf16);
  char name[200];
  if (role == IR_LINEAR_ROWS) {
    cu_tx(o,
          "/* %s: %s (kernels/hpdl_lmce.cuh): %" PRId64 " rows of %" PRId64 " over a vocabulary of %" PRId64
          "%s, the logits in 64 x 64 tiles never stored;\n * s0 a block per row tile and vocabulary split (%d), s1 a thread "
          "a row merging the splits */\n",
          b, ir_op_name(n->op), P, C, Vw, rows_w ? " (w [V, C])" : "", L.splits);
    cu_tx(o, "static __device__ float %s_part[%lld];\n\n", b, L.scratch_fwd);
    step_name(k, 0, 2, name, sizeof name);
    cu_signature_min(k, o, name, HPDL_LMCE_MIN_BLOCKS);
    cu_tx(o, "%s", shape);
    cu_tx(o, "  for (long long blk = blockIdx.x; blk < %lldLL; blk += gridDim.x)\n", L.grid_fwd);
    cu_tx(o, "    hpdl_lmce_fwd<%s, %s, int>(p%d, p%d, %s, %s_part, %s_part + %lldLL, %s_part + %lldLL, s, blk);\n}\n\n", tx, tx,
          io[0], io[1], tgt, b, b, (long long)L.splits * P, b, 2LL * L.splits * P);
    cu_add_launch(k, name, 0, "special", L.grid_fwd, HPDL_LMCE_THREADS);
    k->t->launch[k->t->nlaunch - 1].flops = flops;
    step_name(k, 1, 2, name, sizeof name);
    cu_signature(k, o, name);
    cu_tx(o, "%s", shape);
    cu_tx(o, "  hpdl_lmce_rows<int>(%s_part, %s_part + %lldLL, %s_part + %lldLL, %s, p%d, s);\n}\n\n", b, b,
          (long long)L.splits * P, b, 2LL * L.splits * P, tgt, out);
    cu_add_launch(k, name, 1, "special", blocks_for(P), CU_BLOCK);
    return 0;
  }
  /* the backward: inputs x, w, [t], nll or lse, dy */
  int lrow = io[ce ? 3 : 2], dyio = io[ce ? 4 : 3], nsteps = (ce ? 1 : 0) + (dxn >= 0) + (dwn >= 0), step = 0;
  cu_tx(o,
        "/* %s: %s of the fused head (kernels/hpdl_lmce.cuh): %" PRId64 " rows of %" PRId64 " over a vocabulary of %" PRId64
        ", the logits made again in 64 x 64 tiles:%s%s%s */\n",
        b, dxn >= 0 && dwn >= 0 ? "dx and dw" : dxn >= 0 ? "dx" : "dw", P, C, Vw,
        ce ? " the rows' lse = nll + z[t] (a warp a row);" : "", dxn >= 0 ? " dx a block per row tile;" : "",
        dwn >= 0 ? " dw a block per vocabulary tile" : "");
  char lse[200];
  snprintf(lse, sizeof lse, "p%d", lrow);
  if (ce) {
    cu_tx(o, "static __device__ float %s_lse[%" PRId64 "];\n\n", b, P);
    step_name(k, step, nsteps, name, sizeof name);
    cu_signature(k, o, name);
    cu_tx(o, "%s", shape);
    cu_tx(o, "  hpdl_lmce_lse<%s, %s, int>(p%d, p%d, p%d, p%d, %s_lse, s);\n}\n\n", tx, tx, io[0], io[1], io[2], lrow, b);
    cu_add_launch(k, name, step++, "special", (P + CU_BLOCK / 32 - 1) / (CU_BLOCK / 32), CU_BLOCK);
    snprintf(lse, sizeof lse, "%s_lse", b);
  }
  double each = nsteps - ce > 0 ? flops / (nsteps - ce) : 0;
  /* dx a block per row tile, dw a block per vocabulary tile: the same launch but for its function and grid */
  const struct {
    int node, out;
    const char *fn;
    long long grid;
  } grads[2] = {{dxn, dx, "hpdl_lmce_dx", L.grid_dx}, {dwn, dw, "hpdl_lmce_dw", L.grid_dw}};
  for (int q = 0; q < 2; q++) {
    if (grads[q].node < 0) continue;
    step_name(k, step, nsteps, name, sizeof name);
    cu_signature_min(k, o, name, HPDL_LMCE_MIN_BLOCKS);
    cu_tx(o, "%s", shape);
    cu_tx(o, "  for (long long blk = blockIdx.x; blk < %lldLL; blk += gridDim.x)\n", grads[q].grid);
    cu_tx(o, "    %s<%s, %s, int>(p%d, p%d, %s, %s, p%d, p%d, s, blk);\n}\n\n", grads[q].fn, tx, tx, io[0], io[1], tgt, lse,
          dyio, grads[q].out);
    cu_add_launch(k, name, step++, "special", grads[q].grid, HPDL_LMCE_THREADS);
    k->t->launch[k->t->nlaunch - 1].flops = each;
  }
  return 0;
}

/* ---- convolution and pooling: kernels/hpdl_conv.cuh ---- */

/* the kernels' blocks are the back end's (cu_signature_min's launch bounds) */
_Static_assert(HPDL_CONV_THREADS == CU_BLOCK, "hpdl_conv.cuh's blocks are CU_BLOCK threads");

/* Every io of the op in f32, as the kernels take them; -1 after cu_fail. */
static int conv_f32(CuKern *k, const IrNode *n) {
  for (int i = 0; i <= n->nin; i++) {
    const IrNode *x = i < n->nin ? nd(k, n->in[i]) : n;
    if (x->dtype != DT_F32) {
      cu_fail(k->t, "graph %s kernel k%d: %s runs on f32 tensors, not %s", k->fg->graph->name, k->kp, ir_op_name(n->op),
              sem_dtype_name(x->dtype));
      return -1;
    }
  }
  return 0;
}

/* `  const hpdl_conv_shape s = {...};` */
static void conv_shape_text(CuText *o, const hpdl_conv_shape *s) {
  cu_tx(o, "  const hpdl_conv_shape s = {%d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d};\n", s->N, s->C,
        s->H, s->W, s->O, s->KH, s->KW, s->Ho, s->Wo, s->sh, s->sw, s->ph, s->pw, s->dh, s->dw, s->G);
}

static int conv(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int a = io_of(k, n->in[0]), b = io_of(k, n->in[1]), out = io_of(k, id);
  if (a < 0 || b < 0 || out < 0 || conv_f32(k, n)) return -1;
  int op = n->op == IR_CONV2D ? HPDL_CONV_FWD : n->op == IR_CONV2D_BWD_DATA ? HPDL_CONV_BWD_DATA : HPDL_CONV_BWD_FILTER;
  ConvShape cs = ir_conv_shape(k->fg->graph, n);
  const int64_t v[16] = {cs.N,  cs.C,  cs.H,  cs.W,  cs.O,  cs.KH, cs.KW, cs.Ho,
                         cs.Wo, cs.sh, cs.sw, cs.ph, cs.pw, cs.dh, cs.dw, cs.groups};
  int fits = 1;
  for (int i = 0; i < 16; i++) fits &= v[i] >= 0 && v[i] <= 0x7fffffff;
  hpdl_conv_shape s = {(int)cs.N, (int)cs.C, (int)cs.H, (int)cs.W, (int)cs.O, (int)cs.KH, (int)cs.KW, (int)cs.Ho,
                       (int)cs.Wo, (int)cs.sh, (int)cs.sw, (int)cs.ph, (int)cs.pw, (int)cs.dh, (int)cs.dw, (int)cs.groups};
  hpdl_conv_launch L;
  if (!fits || hpdl_conv_plan(op, &s, &L)) {
    cu_fail(k->t,
            "graph %s kernel k%d: no CUDA kernel for %s over [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
            "] with %" PRId64 " filters of %" PRId64 "x%" PRId64 " (kernels/hpdl_conv.cuh keeps its sizes in 32 bits)",
            k->fg->graph->name, k->kp, ir_op_name(n->op), cs.N, cs.C, cs.H, cs.W, cs.O, cs.KH, cs.KW);
    return -1;
  }
  static const char *const fn[3] = {"hpdl_conv_fwd", "hpdl_conv_bwd_data", "hpdl_conv_bwd_filter"};
  const char *b0 = k->base;
  cu_tx(o,
        "/* %s: %s (kernels/hpdl_conv.cuh, implicit GEMM, %dx%d tiles): x [%d, %d, %d, %d], w [%d, %d, %d, %d], y [%d, %d, "
        "%d, %d]; stride %dx%d, padding %dx%d, dilation %dx%d, groups %d",
        b0, ir_op_name(n->op), L.bm, L.bn, s.N, s.C, s.H, s.W, s.O, s.C / s.G, s.KH, s.KW, s.N, s.O, s.Ho, s.Wo, s.sh,
        s.sw, s.ph, s.pw, s.dh, s.dw, s.G);
  if (L.splits > 1)
    cu_tx(o, ";\n * s0 the partials of %d splits of the %lld reductions, s1 their sum in split order", L.splits, L.red);
  cu_tx(o, " */\n");
  double flops = ircost_node(k->t->m, k->fg->graph, id).flops;
  char name[200];
  step_name(k, 0, L.splits > 1 ? 2 : 1, name, sizeof name);
  if (L.splits > 1) cu_tx(o, "static __device__ float %s_part[%lld];\n\n", b0, L.scratch_floats);
  /* at most 128 registers: under __launch_bounds__(256) alone the 4 x 4 tiles spill */
  cu_signature_min(k, o, name, HPDL_CONV_MIN_BLOCKS);
  conv_shape_text(o, &s);
  cu_tx(o, "  for (long long blk = blockIdx.x; blk < %lldLL; blk += gridDim.x)\n", L.grid);
  cu_tx(o, "    %s<%d, %d, %d, %d>(p%d, p%d, ", fn[op], L.bm, L.bn, L.tm, L.tn, a, b);
  if (op != HPDL_CONV_BWD_FILTER) cu_tx(o, "p%d, s, blk);\n}\n\n", out);
  else if (L.splits > 1) cu_tx(o, "%s_part, s, %lldLL, blk);\n}\n\n", b0, L.chunk);
  else cu_tx(o, "p%d, s, %lldLL, blk);\n}\n\n", out, L.chunk);
  cu_add_launch(k, name, 0, "conv", L.grid, HPDL_CONV_THREADS);
  k->t->launch[k->t->nlaunch - 1].flops = flops;
  if (L.splits > 1) {
    step_name(k, 1, 2, name, sizeof name);
    cu_signature_min(k, o, name, HPDL_POOL_MIN_BLOCKS);
    cu_tx(o, "  hpdl_conv_sum_splits(%s_part, p%d, %lldLL, %d);\n}\n\n", b0, out, L.outputs, L.splits);
    cu_add_launch(k, name, 1, "special", blocks_for(L.outputs), CU_BLOCK);
  }
  return 0;
}

static int pool(CuKern *k, const IrNode *n, int id) {
  CuText *o = &k->t->src;
  int bwd = n->op == IR_POOL2D_BWD, x = io_of(k, n->in[0]), dy = bwd ? io_of(k, n->in[1]) : 0, out = io_of(k, id);
  if (x < 0 || dy < 0 || out < 0 || conv_f32(k, n)) return -1;
  PoolShape ps = ir_pool_shape(k->fg->graph, n);
  const int64_t v[12] = {ps.N, ps.C, ps.H, ps.W, ps.Ho, ps.Wo, ps.kh, ps.kw, ps.sh, ps.sw, ps.ph, ps.pw};
  int fits = ps.Ho > 0 && ps.Wo > 0 && ps.H * ps.W <= 0x7fffffff && ps.Ho * ps.Wo <= 0x7fffffff;
  for (int i = 0; i < 12; i++) fits &= v[i] >= 0 && v[i] <= 0x7fffffff;
  if (!fits) {
    cu_fail(k->t, "graph %s kernel k%d: no CUDA kernel for %s over [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]",
            k->fg->graph->name, k->kp, ir_op_name(n->op), ps.N, ps.C, ps.H, ps.W);
    return -1;
  }
  static const char *const modes[POOL_NMODES] = {"max", "avg", "adaptive avg", "adaptive max"};
  cu_tx(o, "/* %s: %s (kernels/hpdl_conv.cuh, a thread per %s): %s [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
           "] -> %" PRId64 "x%" PRId64,
        k->base, ir_op_name(n->op), bwd ? "input element, a gather" : "output", modes[ps.mode], ps.N, ps.C, ps.H, ps.W,
        ps.Ho, ps.Wo);
  if (ps.mode == POOL_MAX || ps.mode == POOL_AVG)
    cu_tx(o, ", window %" PRId64 "x%" PRId64 " stride %" PRId64 "x%" PRId64 " padding %" PRId64 "x%" PRId64, ps.kh, ps.kw,
          ps.sh, ps.sw, ps.ph, ps.pw);
  cu_tx(o, " */\n");
  cu_signature_min(k, o, k->base, HPDL_POOL_MIN_BLOCKS);
  cu_tx(o,
        "  const hpdl_pool_shape s = {%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
        ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %d};\n",
        ps.N, ps.C, ps.H, ps.W, ps.Ho, ps.Wo, ps.kh, ps.kw, ps.sh, ps.sw, ps.ph, ps.pw, (int)ps.mode);
  if (bwd) cu_tx(o, "  hpdl_pool_bwd(p%d, p%d, p%d, s);\n}\n\n", x, dy, out);
  else cu_tx(o, "  hpdl_pool_fwd(p%d, p%d, s);\n}\n\n", x, out);
  cu_add_launch(k, k->base, 0, "special", blocks_for(bwd ? ps.N * ps.C * ps.H * ps.W : ps.N * ps.C * ps.Ho * ps.Wo),
                CU_BLOCK);
  return 0;
}

/* ---- extern: a native function of the host ---- */

/* The host program calls it between launches (libffi, core/extcall.h) on host copies of
 * the kernel's buffers: a launch of kind "host" with the buffers in the function's order
 * and no device code. */
static int host_extern(CuKern *k, const IrNode *n, int id) {
  int io[16], nio = 0;
  if (n->nin + 1 > (int)(sizeof io / sizeof io[0])) {
    cu_fail(k->t, "graph %s kernel k%d: an extern call with %d buffers (the CUDA target takes at most %d)",
            k->fg->graph->name, k->kp, n->nin + 1, (int)(sizeof io / sizeof io[0]));
    return -1;
  }
  for (int i = 0; i < n->nin; i++)
    if ((io[nio++] = io_of(k, n->in[i])) < 0) return -1;
  if ((io[nio++] = io_of(k, id)) < 0) return -1;
  cu_tx(&k->t->src, "/* %s: %s of extern %" PRId64 ": the host program calls the native function (no device code) */\n\n",
        k->base, ir_op_name(n->op), n->attr[0]);
  cu_add_launch(k, k->base, 0, "host", 1, 1);
  CuLaunch *l = &k->t->launch[k->t->nlaunch - 1];
  l->host_extern = (int)n->attr[0];
  l->host_grad = n->op == IR_EXTERN_GRAD;
  l->nhost_io = nio;
  memcpy(l->host_io, io, sizeof(int) * (size_t)nio);
  return 0;
}

int cu_special(CuKern *k) {
  int id = special_node(k);
  const IrNode *n = nd(k, id);
  if (fuse_ce_pair(k->fg, k->kp)) return ce_pair(k);
  if (fuse_linear_ce_pair(k->fg, k->kp)) /* dx's node leads: the pair's launches make both */
    for (int j = 0; j < k->K->nnodes; j++)
      if (ir_linear_role(nd(k, k->K->nodes[j])->op) == IR_LINEAR_DX) return linear_ce(k, nd(k, k->K->nodes[j]), k->K->nodes[j]);
  switch (n->op) {
  case IR_EMBEDDING: return embedding_fwd(k, n, id);
  case IR_EMBEDDING_BWD: return embedding_bwd(k, n, id);
  case IR_ROPE: return rope(k, n, id);
  case IR_CROSS_ENTROPY:
  case IR_CROSS_ENTROPY_BWD: return cross_entropy(k, n, id);
  case IR_PICK:
  case IR_PICK_BWD: return pick(k, n, id);
  case IR_REPEAT_KV_BWD: return repeat_kv_bwd(k, n, id);
  case IR_SUM_TO:
  case IR_REDUCE_SUM: return sum_to(k, n, id);
  case IR_EXTERN:
  case IR_EXTERN_GRAD: return host_extern(k, n, id);
  case IR_TOPK: return topk(k, n, id);
  case IR_TAKE:
  case IR_TAKE_BWD: return take(k, n, id);
  case IR_ONE_HOT: return one_hot(k, n, id);
  case IR_MOE_DISPATCH:
  case IR_MOE_COMBINE:
  case IR_MOE_GATE_GRAD: return moe(k, n, id);
  case IR_MOE_EXPERT_IDS: return expert_ids(k, n, id);
  case IR_GROUPED_MM:
  case IR_GROUPED_MM_WGRAD: return grouped(k, n, id);
  case IR_AUX_LOSS: return aux_loss(k, n, id);
  case IR_STATE_UPDATE: return state_update(k, n, id);
  case IR_ATTENTION:
  case IR_ATTENTION_BWD: return attention(k, n, id);
  case IR_CONV2D:
  case IR_CONV2D_BWD_DATA:
  case IR_CONV2D_BWD_FILTER: return conv(k, n, id);
  case IR_POOL2D:
  case IR_POOL2D_BWD: return pool(k, n, id);
  case IR_LINEAR_CE:
  case IR_LINEAR_CE_BWD:
  case IR_LINEAR_CE_BWD_W:
  case IR_LINEAR_LSE:
  case IR_LINEAR_LSE_BWD:
  case IR_LINEAR_LSE_BWD_W: return linear_ce(k, n, id);
  case IR_ATTN_MERGE: return attn_merge_kernel(k, n, id);
  default:
    cu_fail(k->t, "graph %s kernel k%d: no CUDA kernel for %s", k->fg->graph->name, k->kp, ir_op_name(n->op));
    return -1;
  }
}
