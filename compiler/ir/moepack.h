/* moepack.h - dropless experts over the rows routed to them.
 *
 * A dropless mixture-of-experts layer (moe_dispatch with room for every token:
 * capacity T, std/moe's drop = false) is written over [B, E, T, C] slots: every
 * expert has a slot for each token of the sequence, so its GEMMs and the
 * element-wise ops between them run over E / K times the rows routed. This
 * pass rewrites the chain from such a dispatch to its combine into the packed
 * form of ir_ops.h: the B T K routed rows sorted by expert ([N, C]), each
 * expert GEMM a GROUPED_MM over its rows (MOE_EXPERT_IDS gives each row's
 * expert), the element-wise ops over [N, ...] rows, a per-expert bias
 * ([E, 1, Y]) as its rows (a grouped product of ones with it). The values are
 * the same (a slot's GEMM row is a routed row's); only the empty slots go.
 *
 * The chain must be what std/moe's experts write: batched products of the
 * slots with [E, X, Y] weights, and element-wise ops (not position-dependent
 * ones: masks, dropout) whose other operands are scalars, last-axis vectors
 * or per-expert [E, 1, Y] values, ending in the combine; the routing must be
 * a top-k (each token's experts distinct, so T slots never overflow). Any
 * other reader leaves the layer as it is. Expert parallelism exchanges the
 * slots with a fixed-size all-to-all, so compile runs the pass at ep = 1 only.
 */
#ifndef HPDL_MOEPACK_H
#define HPDL_MOEPACK_H

#include "ir.h"

/* Rewrites every dropless layer of m's graphs that fits; returns how many. */
int moe_pack_dropless(IrModule *m);

/* Expert parallelism's slots, expert-major: every layer left over slots whose
 * chain fits (as above, any capacity) runs it over [E, B cap, Y] instead of
 * [B, E, cap, Y] - a transpose and a view after the dispatch, their inverse
 * before the combine - so that each expert's GEMM is one over all the slots
 * it was sent (the all-to-all concatenates the members' slots on that axis)
 * and its weight gradient one GEMM of depth ep B cap, where the [B, E, cap, ..]
 * order needs a product per sequence and their sum. Only where that saves
 * more bytes than the four transposes cost (moepack.c, major_pays: the weights'
 * X Y (1 - 1 / (ep B)) summed over the chain above 2 cap (C + C_out)).
 * Returns how many layers. */
int moe_expert_major(IrModule *m, int64_t ep);

/* The experts' layers as `hpdlc compile` runs them at expert parallelism ep
 * (the defaults: no --experts slots): packed at ep <= 1, expert-major where
 * it pays above, their sequences chunked first over fold_tp > 1 under
 * parallel folding (moe_fold_sequences, with `priced`; under context
 * parallelism, cp > 1, only checked, moe_fold_check_cp). For emit, plan and
 * the simulators, which show or price the compiled program. -1 with *why when
 * folding cannot split a layer. */
int moe_as_compiled(IrModule *m, int64_t ep, int64_t fold_tp, int64_t cp, int priced, const char **why);

/* Whether slot dispatch d of g has room for every token of its sequences
 * (attr[3], which the lowering sets also where the planner's buffer is the
 * expected load) and takes a top-k's choices, each expert at most once a
 * token: then no subset of the tokens (a context chunk, a tensor piece of it)
 * drops any either. */
int moe_holds_every_token(const IrGraph *g, const IrNode *d);

/* Parallel folding under context parallelism: the sequences are not chunked
 * here; the partitioner routes each rank's own tokens (its context chunk's
 * tensor piece) into slots of its own (spmd.c, cp_local_slots), which needs
 * every layer dropless (the dispatch's attr[3]: room for every token) and over
 * slots. The layers so routed, or -1 with *why. */
int moe_fold_check_cp(const IrModule *m, const char **why);

/* MoE parallel folding (parallel.expert_tensor = 1 at tensor = tp > 1): every
 * layer's tokens routed a sequence chunk at a time, the chunk that sequence
 * parallelism gives each tensor rank: the dispatch's and the combine's [B, T,
 * Z] operands viewed as [tp B, T / tp, Z] (chunk j of sequence b is sequence
 * j B + b, so the tensor group's split of the sequences is one of the leading
 * axis), the slots [tp B, E, cap / tp, Y], the combine's result viewed back.
 * Each tensor rank then routes its own tokens and the expert group, folded
 * over tensor x data ranks, exchanges them (spmd.c). Dropless layers only
 * (room for every token: a chunk's tokens fit in T / tp slots, so the values
 * are the unchunked layer's, in another slot order) unless `priced` (the
 * planner's slots at the expected load). Returns the layers rewritten, or -1
 * with *why when a layer cannot be. */
int moe_fold_sequences(IrModule *m, int64_t tp, int priced, const char **why);

/* The dispatches of m with room for every token (dropless) left over slots. */
int moe_dropless_slots(const IrModule *m);

/* The dispatches of m that drop tokens (fewer slots than the sequence's tokens):
 * under context parallelism each routes whole sequences (spmd.c). */
int moe_dropping(const IrModule *m);

#endif
