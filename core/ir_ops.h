/* ir_ops.h - the tensor IR's op set, defined once.
 *
 * X(ID, "name", inputs, flags)
 *   inputs: the number of tensor inputs, or -1 for variadic.
 *   flags:  IRF_ELEMENTWISE (same-shape map, fusable), IRF_UNARY (one input),
 *           IRF_LEAF (no inputs), IRF_COMM (a collective or transfer),
 *           IRF_REDUCE (reduces one axis), IRF_SHAPE (moves data, computes nothing).
 *
 * Each row has, by naming convention, a shape rule `irshape_ID` (ir.c), a
 * cost rule `ircost_ID` (ir_cost.c) and a gradient rule `adgrad_ID`
 * (autodiff.c); each of those files builds its table from this list, so an
 * op cannot exist without all three.
 *
 * Attributes (IrNode.attr / fattr) per op:
 *   INPUT: attr[0] = model input index          PARAM: attr[0] = module param index
 *   ARG: attr[0] = graph argument index         FILL/CONST: fattr = value
 *   IOTA: 0, 1, ..., n-1 (an integer vector; arange)
 *   POWS: fattr = exponent                      ACT_GRAD: attr[0] = the IrOp whose derivative
 *                                              (times dy); fattr = POWS's exponent
 *   MATMUL: attr[0] = transpose a, attr[1] = transpose b
 *   REDUCE_*: attr[0] = axis, attr[1] = keepdim
 *   SOFTMAX*, LOG_SOFTMAX*: attr[0] = axis      CONCAT: attr[0] = axis
 *   TRANSPOSE: attr[0..rank) = permutation (output axis i reads input axis perm[i])
 *   SLICE: attr[0..8) = start per input axis; output dims give the sizes;
 *          attr[8..16) = 1 where the axis is dropped (indexing)
 *   PAD: attr[0..8) = start of the input inside the (zero) output
 *   CAUSAL_MASK: fattr = the fill above the diagonal (-inf forward, 0 backward)
 *   ROPE: fattr = base, attr[0] = 1 for the inverse rotation (backward)
 *   REPEAT_KV, REPEAT_KV_BWD: attr[0] = n
 *   DROPOUT: fattr = p, attr[0] = seed stream
 *   CALL: attr[0] = graph index, attr[1] = repeat count, attr[2] = mode
 *         (IR_CALL_PLAIN / SAVE / BACKWARD, ir.h)
 *   collectives: attr[0] = IrGroup, attr[1] = axis (gather / scatter) or peer stage offset (send / recv)
 *     ALL_REDUCE: attr[2] = 0 sum, 1 max; attr[3] = 1: no gradient flows back (a max used as a shift)
 *     ALL_GATHER, REDUCE_SCATTER, SHARD_SLICE: attr[2] = layout of the split axis (0 contiguous
 *       chunks in rank order; 1 zigzag: with c ranks the axis is cut into 2c chunks and rank r
 *       holds chunks r and 2c-1-r, balancing causal attention); ALL_GATHER attr[3] = 1 when its
 *       output's gradient arrives partial (its consumers' outputs are split), so the backward
 *       reduce-scatters instead of slicing
 *   SHARD_SLICE: this rank's chunk of a replicated value (output dims given)
 *   COPY_TO_GROUP: identity forward, all-reduce of the gradient over attr[0] (Megatron's f)
 *   PICK(z [..., V], t [...]): z[..., t - offset], 0 outside the local range; attr[0] = 0, or
 *     1 + group when z is this rank's vocabulary shard (offset = rank x V)
 *   PICK_BWD(dy [...], t [...]): the scatter of dy into zeros of the given [..., V]; attr as PICK
 *   EMBEDDING, EMBEDDING_BWD: attr[0] = 1 + group for a vocabulary-parallel table (rows outside
 *     this rank's range read as zeros / are not written)
 *   CAUSAL_MASK: attr[0] = 1 + group when the rows are this rank's zigzag chunks of the sequence;
 *     attr[1] = 1 + group when the columns are the group's key blocks in ring order (block b
 *     from rank r - b, each in the zigzag layout)
 *   VOCAB_MASK(z [..., V]): z where the column's global index is below attr[1] (the vocabulary
 *     before padding, parallel.vocab_pad), fattr elsewhere (-inf forward, 0 backward); attr[0]
 *     = 0, or 1 + group when z is this rank's vocabulary shard (global column = rank x V + col)
 *   ROPE: attr[1] = 1 + group when the positions are this rank's zigzag chunks;
 *     attr[2] = 1 for YaRN's frequencies (Peng et al. 2023; GPT-OSS, DeepSeek-V3), with
 *     attr[3..6) the bit patterns of the doubles factor, beta_fast, beta_slow, attr[6] the
 *     original context length, attr[7] = 1 to truncate the ramp's ends to whole pairs
 *     (ir_rope_gain: pair i turns at base^(-2i/D) x its gain); attr[8] = 1 when x is
 *     [B, T, H, D] (the positions along axis 1, lower.c's sink_rope_transposes), else [B, H, T, D]
 *   CALL: attr[3] = the first layer this call runs (pipeline chunks run a range of layers)
 *   EXTERN(args...): a native function (docs/language.md, "Extern"); attr[0] = index into
 *     IrModule.externs, attr[1] = the result's rank, attr[2..2+rank) its dimensions (the result
 *     type travels in the attributes, so every pass that copies nodes keeps it)
 *   EXTERN_GRAD(args..., dy): the extern's gradient function, called once: the gradients of all
 *     arguments, flattened and concatenated in argument order (f32[sum of the numels]);
 *     attr[0] = the extern
 *   TOPK(x [..., V]): i32 [..., k], the positions of the k largest entries of each row in
 *     descending order of value, ties broken by the lower position; attr[0] = k (1 <= k <= V).
 *     No gradient (its output is integer); topk values are TAKE(x, TOPK(x))
 *   TAKE(x [..., V], idx [..., K]): x[..., idx[..., j]] per row (numpy's take_along_axis on
 *     the last axis); an index outside [0, V) is an error
 *   TAKE_BWD(dy [..., K], idx [..., K]): the scatter-add of dy into zeros of the given [..., V]
 *   ONE_HOT(idx [...]): float [..., n], 1 where the last position equals idx, else 0 (a row of
 *     zeros for an index outside [0, n): a dropped token); attr[0] = n. No gradient
 *   Mixture of experts, capacity-based (GShard): each sequence b routes its T tokens to E
 *   experts, each of which takes at most cap of them. Slots are given in priority order: all
 *   first choices (k = 0) in token order, then all second choices, and so on (ties in routing
 *   were broken by the lower expert already); a choice whose expert is full is dropped.
 *   MOE_DISPATCH(x [B, T, C], idx i32[B, T, K], w [B, T, K]): [B, E, cap, C], slot (e, c) holds
 *     w[b, t, k] x[b, t] for the choice (t, k) given that slot, zeros when empty;
 *     attr[0] = E, attr[1] = cap, attr[2] = the slots an expert is expected to fill (the
 *     planner's price: cap when tokens are dropped; capacity_factor x T K / E when the buffer
 *     holds all T tokens so that none is dropped), attr[3] = 1 when the buffer has room for
 *     every token (cap = T, also in the planner's IR, whose cap is the expected load)
 *   MOE_COMBINE(y [B, E, cap, C], idx, w): [B, T, C], sum over k of w[b, t, k] y[b, slot(t, k)],
 *     dropped choices add nothing (E and cap are y's)
 *   MOE_GATE_GRAD(a [B, T, C], y [B, E, cap, C], idx): [B, T, K], a[b, t] . y[b, slot(t, k)],
 *     0 for a dropped choice. The three are each other's adjoints (autodiff.c)
 *   Dropless experts packed (compiler/ir/moepack.c): the same three ops with the routed
 *   rows in one [N, C] matrix, N = B T K, sorted by expert: row of choice c = (b T + t) K + k
 *   is the number of choices of lower experts plus that of the earlier choices (in c) of
 *   its own, so every choice has a row and none is dropped. MOE_DISPATCH with attr[1] = 0
 *   gives [N, C]; MOE_COMBINE reads y [N, C], MOE_GATE_GRAD y [N, C]; attr[0] = E on all
 *   three (the bound on idx)
 *   MOE_EXPERT_IDS(idx i32[B, T, K]): i32 [B T K], idx's values sorted ascending: the
 *     expert of each packed row; attr[0] = E. No gradient
 *   GROUPED_MM(a [N, X], w [E, X, Y], ids i32[N]): [N, Y], row r = a[r] w[ids[r]] (attr[0]
 *     = 1: w [E, Y, X] read transposed, a[r] w[ids[r]]^T): each expert's GEMM over the
 *     rows routed to it, runs of equal ids (sorted ids make one GEMM an expert)
 *   GROUPED_MM_WGRAD(a [N, X], dy [N, Y], ids): [E, X, Y], expert e's a^T dy summed over
 *     its rows (zero for an expert with none); attr[0] = E. GROUPED_MM's weight gradient
 *   AUX_LOSS(x, v): x; its backward passes dy on to x and gives the scalar v the gradient
 *     fattr x LOSS_SEED, as if fattr v were added to the loss (Megatron-Core's
 *     MoEAuxLossAutoScaler): a layer adds its load-balancing loss without returning it, also
 *     from inside a repeat
 *   LOSS_SEED: f32 [], the seed of the backward being run (d loss, the step's gradient scale)
 *   TRAINING: f32 [], 1 in a training step, 0 in an evaluation (a validation pass): batch
 *     norm's choice between the batch's statistics and the running ones, dropout's of
 *     dropping; the executor fills it like LOSS_SEED. No gradient
 *   ALL_TO_ALL(x): attr[0] = group (of g members), attr[1] = the split axis, attr[2] = the concat
 *     axis: x is cut into g chunks along the split axis, chunk j goes to member j, and the chunks
 *     received are concatenated in member order along the concat axis (output dims given). Expert
 *     parallelism's dispatch: [B, E, cap, C] split 1 concat 0 -> [g B, E / g, cap, C]; its
 *     gradient is the all-to-all with the two axes swapped
 *   ATTENTION(q [B, H, T, D], k [B, Hk, S, D], v [B, Hk, S, Dv]): scaled dot-product attention
 *     with the softmax's statistics, packed [B, H, T, Dv + 1]: [..., :Dv] = sum_j P[t, j] v[j],
 *     [..., Dv] = lse[t] = log sum_j exp(s[t, j]) over the allowed keys, s = fattr q[t] . k[j],
 *     P = exp(s - lse); query head h reads key / value head h / (H / Hk) (grouped-query
 *     attention). attr[0] = 1: causal (key j allowed when its position <= query t's);
 *     attr[3] = W > 0: and within a sliding window (query t's position minus key j's < W, so
 *     W keys at most, the query's own among them; causal only; 0: no window);
 *     attr[1] = 1 + group when the rows are this rank's zigzag chunks, attr[2] = 1 + group when
 *     the keys are the group's blocks in ring order (positions as CAUSAL_MASK's) or, with
 *     attr[4] = 1 + s, one block: the one received at ring step s, rank r - s's zigzag chunks
 *     (ring attention a block at a time, parallel.cp_comm = ring; ATTN_MERGE). A row with no
 *     allowed key gives o = 0 and lse = -inf. The scores are never a value of the graph: a
 *     back end computes them in tiles (flash attention)
 *   ATTENTION_BWD(q, k, v, out, dout): the gradients of ATTENTION (attributes as its), f32 flat
 *     [numel q + numel k + numel v]: dq, dk, dv one after another. dout is the packed output's
 *     gradient, its last column d lse: with P = exp(s - lse) from out's lse, D[t] = dout[t, :Dv]
 *     . o[t] - dout[t, Dv], dS = P (dout[:Dv] v^T - D), dq = fattr dS k, dk = fattr dS^T q, dv = P^T dout[:Dv]
 *     (summed over the query heads sharing a key head)
 *   ATTN_MERGE(a_0, ..., a_{c-1}): ring attention's merge (parallel.cp_comm = ring): each a_s
 *     the packed output [B, H, T, Dv + 1] of an ATTENTION over one ring block (attr[4] > 0),
 *     read by nothing else; the result is attention over all the blocks, packed alike:
 *     lse = log sum_s exp(lse_s), o = sum_s exp(lse_s - lse) o_s (a block with lse_s = -inf
 *     weighs 0; all -inf: o = 0, lse = -inf). Its gradient contract (autodiff.c): each a_s
 *     is given the merged output's gradient, and its ATTENTION_BWD reads the merged output
 *     in place of a_s - the block's share of the whole attention's gradient (P from the
 *     merged lse, Dt from the merged o), so the blocks' outputs need not be kept
 *   Convolutional networks (core/numeric/conv.h has the arithmetic), NCHW:
 *   CONV2D(x [N, C, H, W], w [O, C/g, KH, KW]): [N, O, Ho, Wo], PyTorch's conv2d without bias:
 *     y[n, o, i, j] = sum over c, ki, kj of x[n, (o / (O/g)) C/g + c, i sh - ph + ki dh,
 *     j sw - pw + kj dw] w[o, c, ki, kj] (0 outside the image); Ho = (H + 2 ph - dh (KH - 1) - 1)
 *     / sh + 1. attr (conv.h CONV_A_*): [0..2) stride h, w; [2..4) padding; [4..6) dilation;
 *     [6] groups g; [7..9) the input's H, W; [9..11) KH, KW (so that the gradients' shapes
 *     follow from their inputs: every attribute on all three ops)
 *   CONV2D_BWD_DATA(dy [N, O, Ho, Wo], w): dx [N, C, H, W], the adjoint of CONV2D in x
 *   CONV2D_BWD_FILTER(x, dy): dw [O, C/g, KH, KW], the adjoint of CONV2D in w
 *   POOL2D(x [N, C, H, W]): [N, C, Ho, Wo]; attr (POOL_A_*): [0] mode (PoolMode: 0 max, 1 avg
 *     with the padding counted, 2 adaptive avg, 3 adaptive max), [1..3) the window KH, KW (the
 *     output size Ho, Wo when adaptive), [3..5) stride, [5..7) padding (at most half the window)
 *   POOL2D_BWD(x, dy [N, C, Ho, Wo]): dx, dy to the window's first max, or dy / count to each
 *     input of the window (attr as POOL2D's)
 *   STATE_UPDATE(x, value, p): x; and p, the PARAM node of a state parameter (IrParam.state:
 *     batch norm's running statistics), takes value (p's shape) as its new contents, when the
 *     node runs in a forward (a step graph's forward part, or a graph that is not a backward),
 *     not in the recomputation a backward runs (AUX_LOSS's rule). Its gradient passes dy to x
 *     only. The micro-batches of a step update in their order
 *   The language model's head and its loss in one (parallel.fused_ce; compiler/ir/headloss.c):
 *   LINEAR_CE(x [..., C], w, t [...]): f32 [...], row r's loss lse(z_r) - z_r[t_r] with z_r =
 *     x_r W, W = w [C, V] (attr[0] = 0) or w^T for w [V, C] (attr[0] = 1: a tied embedding
 *     table). The logits z are never a value of the graph: a back end computes them in blocks
 *     of rows and vocabulary; a target outside [0, V) is an error
 *   LINEAR_CE_BWD(x, w, t, nll, dy [...]): dx [..., C] = sum_v g[r, v] W[:, v] with g[r, v] =
 *     dy_r (softmax(z_r)_v - [v = t_r]); nll is LINEAR_CE's output (lse_r = nll_r + z_r[t_r],
 *     so the backward recomputes z but not its log-sum-exp). attr as LINEAR_CE's
 *   LINEAR_CE_BWD_W(x, w, t, nll, dy): dw (w's shape) = sum_r g[r, v] x_r, in w's layout
 *   LINEAR_LSE(x [..., C], w): f32 [...], each row's log sum_v exp(z_r[v]), the head's logits
 *     over this rank's vocabulary shard: the vocab-parallel form (the target's logit and the
 *     reduction over the tensor group are other ops, spmd.c). attr[0] as LINEAR_CE's;
 *     attr[1] = 1 + group when w is this rank's shard of a padded vocabulary, attr[2] the
 *     vocabulary before padding: columns whose global index (rank x V + v) is at or past it
 *     take no part (a row with none has -inf)
 *   LINEAR_LSE_BWD(x, w, lse, dy): dx = sum_v dy_r softmax(z_r)_v W[:, v] over the columns
 *     taken, lse the op's output; LINEAR_LSE_BWD_W(x, w, lse, dy): dw, zero in the padding
 */
#ifndef HPDL_IR_OPS_H
#define HPDL_IR_OPS_H

#define IRF_ELEMENTWISE 1
#define IRF_UNARY 2
#define IRF_LEAF 4
#define IRF_COMM 8
#define IRF_REDUCE 16
#define IRF_SHAPE 32

#define IR_OPS(X)                                                  \
  X(INPUT, "input", 0, IRF_LEAF)                                   \
  X(PARAM, "param", 0, IRF_LEAF)                                   \
  X(ARG, "arg", 0, IRF_LEAF)                                       \
  X(CONST, "const", 0, IRF_LEAF)                                   \
  X(FILL, "fill", 0, IRF_LEAF)                                     \
  X(IOTA, "iota", 0, IRF_LEAF)                                     \
  X(NEG, "neg", 1, IRF_ELEMENTWISE | IRF_UNARY)                    \
  X(RELU, "relu", 1, IRF_ELEMENTWISE | IRF_UNARY)                  \
  X(GELU, "gelu", 1, IRF_ELEMENTWISE | IRF_UNARY)                  \
  X(SILU, "silu", 1, IRF_ELEMENTWISE | IRF_UNARY)                  \
  X(SIGMOID, "sigmoid", 1, IRF_ELEMENTWISE | IRF_UNARY)            \
  X(TANH, "tanh", 1, IRF_ELEMENTWISE | IRF_UNARY)                  \
  X(EXP, "exp", 1, IRF_ELEMENTWISE | IRF_UNARY)                    \
  X(LOG, "log", 1, IRF_ELEMENTWISE | IRF_UNARY)                    \
  X(SQRT, "sqrt", 1, IRF_ELEMENTWISE | IRF_UNARY)                  \
  X(RSQRT, "rsqrt", 1, IRF_ELEMENTWISE | IRF_UNARY)                \
  X(ABS, "abs", 1, IRF_ELEMENTWISE | IRF_UNARY)                    \
  X(SQUARE, "square", 1, IRF_ELEMENTWISE | IRF_UNARY)              \
  X(POWS, "pow", 1, IRF_ELEMENTWISE | IRF_UNARY)                   \
  X(ACT_GRAD, "act_grad", 2, IRF_ELEMENTWISE)                      \
  X(ADD, "add", 2, IRF_ELEMENTWISE)                                \
  X(SUB, "sub", 2, IRF_ELEMENTWISE)                                \
  X(MUL, "mul", 2, IRF_ELEMENTWISE)                                \
  X(DIV, "div", 2, IRF_ELEMENTWISE)                                \
  X(MAXIMUM, "maximum", 2, IRF_ELEMENTWISE)                        \
  X(MINIMUM, "minimum", 2, IRF_ELEMENTWISE)                        \
  X(MATMUL, "matmul", 2, 0)                                        \
  X(REDUCE_SUM, "reduce_sum", 1, IRF_REDUCE)                       \
  X(REDUCE_MEAN, "reduce_mean", 1, IRF_REDUCE)                     \
  X(REDUCE_MAX, "reduce_max", 1, IRF_REDUCE)                       \
  X(EXPAND, "expand", 1, IRF_SHAPE)                                \
  X(SUM_TO, "sum_to", 1, IRF_REDUCE)                               \
  X(SOFTMAX, "softmax", 1, IRF_REDUCE)                             \
  X(SOFTMAX_BWD, "softmax_bwd", 2, IRF_REDUCE)                     \
  X(LOG_SOFTMAX, "log_softmax", 1, IRF_REDUCE)                     \
  X(LOG_SOFTMAX_BWD, "log_softmax_bwd", 2, IRF_REDUCE)             \
  X(RESHAPE, "reshape", 1, IRF_SHAPE)                              \
  X(TRANSPOSE, "transpose", 1, IRF_SHAPE)                          \
  X(SLICE, "slice", 1, IRF_SHAPE)                                  \
  X(PAD, "pad", 1, IRF_SHAPE)                                      \
  X(CONCAT, "concat", -1, IRF_SHAPE)                               \
  X(EMBEDDING, "embedding", 2, 0)                                  \
  X(EMBEDDING_BWD, "embedding_bwd", 2, 0)                          \
  X(CAUSAL_MASK, "causal_mask", 1, IRF_ELEMENTWISE | IRF_UNARY)    \
  X(VOCAB_MASK, "vocab_mask", 1, IRF_ELEMENTWISE | IRF_UNARY)      \
  X(ROPE, "rope", 1, 0)                                            \
  X(REPEAT_KV, "repeat_kv", 1, IRF_SHAPE)                          \
  X(REPEAT_KV_BWD, "repeat_kv_bwd", 1, IRF_REDUCE)                 \
  X(CROSS_ENTROPY, "cross_entropy", 2, IRF_REDUCE)                 \
  X(CROSS_ENTROPY_BWD, "cross_entropy_bwd", 3, 0)                  \
  X(DROPOUT, "dropout", 1, IRF_ELEMENTWISE | IRF_UNARY)            \
  X(CAST, "cast", 1, IRF_ELEMENTWISE | IRF_UNARY)                  \
  X(CALL, "call", -1, 0)                                           \
  X(ALL_REDUCE, "all_reduce", 1, IRF_COMM)                         \
  X(ALL_GATHER, "all_gather", 1, IRF_COMM)                         \
  X(REDUCE_SCATTER, "reduce_scatter", 1, IRF_COMM)                 \
  X(SEND, "send", 1, IRF_COMM)                                     \
  X(RECV, "recv", 0, IRF_COMM | IRF_LEAF)                          \
  X(SHARD_SLICE, "shard_slice", 1, IRF_COMM)                       \
  X(COPY_TO_GROUP, "copy_to_group", 1, IRF_COMM)                   \
  X(PICK, "pick", 2, IRF_REDUCE)                                   \
  X(PICK_BWD, "pick_bwd", 2, 0)                                     \
  X(EXTERN, "extern", -1, 0)                                       \
  X(EXTERN_GRAD, "extern_grad", -1, 0)                             \
  X(TOPK, "topk", 1, 0)                                            \
  X(TAKE, "take", 2, 0)                                            \
  X(TAKE_BWD, "take_bwd", 2, 0)                                    \
  X(ONE_HOT, "one_hot", 1, 0)                                      \
  X(MOE_DISPATCH, "moe_dispatch", 3, 0)                            \
  X(MOE_COMBINE, "moe_combine", 3, 0)                              \
  X(MOE_GATE_GRAD, "moe_gate_grad", 3, 0)                          \
  X(AUX_LOSS, "aux_loss", 2, 0)                                    \
  X(LOSS_SEED, "loss_seed", 0, IRF_LEAF)                           \
  X(ALL_TO_ALL, "all_to_all", 1, IRF_COMM)                        \
  X(ATTENTION, "attention", 3, 0)                                  \
  X(ATTENTION_BWD, "attention_bwd", 5, 0)                          \
  X(ATTN_MERGE, "attn_merge", -1, 0)                               \
  X(CONV2D, "conv2d", 2, 0)                                        \
  X(CONV2D_BWD_DATA, "conv2d_bwd_data", 2, 0)                      \
  X(CONV2D_BWD_FILTER, "conv2d_bwd_filter", 2, 0)                  \
  X(POOL2D, "pool2d", 1, 0)                                        \
  X(POOL2D_BWD, "pool2d_bwd", 2, 0)                                \
  X(STATE_UPDATE, "state_update", 3, 0)                            \
  X(TRAINING, "training", 0, IRF_LEAF)                             \
  X(LINEAR_CE, "linear_ce", 3, 0)                                  \
  X(LINEAR_CE_BWD, "linear_ce_bwd", 5, 0)                          \
  X(LINEAR_CE_BWD_W, "linear_ce_bwd_w", 5, 0)                      \
  X(LINEAR_LSE, "linear_lse", 2, 0)                                \
  X(LINEAR_LSE_BWD, "linear_lse_bwd", 4, 0)                        \
  X(LINEAR_LSE_BWD_W, "linear_lse_bwd_w", 4, 0)                  \
  X(MOE_EXPERT_IDS, "moe_expert_ids", 1, 0)                        \
  X(GROUPED_MM, "grouped_mm", 3, 0)                                \
  X(GROUPED_MM_WGRAD, "grouped_mm_wgrad", 3, 0)

#endif
