/* cost.h - the cost primitives of the planner.
 *
 * The planner (hpdlc plan) walks the partitioned IR and prices every op and
 * every collective with the functions below. They know nothing of the IR:
 * each takes plain numbers (bytes, FLOP, ranks) and a device, link or
 * cluster, so that they can be tested against published figures on their own.
 *
 * Units are SI throughout: bytes, seconds, FLOP, FLOP/s, bytes/s. Every
 * formula, its assumptions and its source are in docs/planner.md; the
 * comments here name the source and say why, the document has the detail. */
#ifndef HPDL_COST_H
#define HPDL_COST_H

#include <stdint.h>

#include "catalog.h"
#include "sema.h" /* Schedule, Precision, OptimizerKind, SemCluster */

/* ---- calibrated constants (docs/planner.md, "Calibrated constants") ---- */

/* Fraction of the intra-node fabric's one-direction bandwidth that an NCCL
 * ring all-reduce reaches as bus bandwidth on large messages: 232.5 GB/s of
 * 300 GB/s on 8 x A100 SXM over NVSwitch (NVIDIA/nccl issue #1048,
 * all_reduce_perf up to 4 GB). */
#define COST_NCCL_INTRA_EFFICIENCY 0.78
/* The same fraction for the network: 86 GB/s bus bandwidth between two
 * 8 x A100 nodes with 4 x HDR 200 Gb/s (100 GB/s) per node (NVIDIA/nccl
 * #1048); nccl-tests #119 reports 84.8 GB/s of the same 100 GB/s. */
#define COST_NCCL_INTER_EFFICIENCY 0.86
/* Fraction of the datasheet HBM bandwidth that a streaming (copy, triad,
 * elementwise) kernel sustains; an assumption, see docs/planner.md. */
#define COST_HBM_EFFICIENCY 0.90
/* Edge of the square output tile of one thread block of a tensor-core GEMM
 * (cuBLAS / CUTLASS 128x128 tiles on A100 and H100). */
#define COST_GEMM_TILE 128
/* Fixed cost of one output tile (filling the software pipeline, the
 * epilogue), expressed in elements of K of a 16-bit mainloop: a GEMM of
 * depth k runs at k / (k + COST_GEMM_K_OVERHEAD) of its mainloop rate. The
 * cost is a time, so a precision whose mainloop runs r times the 16-bit
 * rate (FP8: 2) pays r x as many elements (cost_gemm_k_overhead). */
#define COST_GEMM_K_OVERHEAD 64
/* GEMM ceiling for devices without a measured one: the H100 SXM figure
 * (docs/planner.md sec. 3.2). */
#define COST_GEMM_CEILING_DEFAULT 0.820

/* ---- collectives on the nccl-tests bus-bandwidth model ----
 *
 * A link is what one rank sees: the bus bandwidth it sustains for a
 * collective (bytes/s, one direction) and the start-up latency of one step
 * of the algorithm (the alpha of an alpha-beta model). */
typedef struct CostLink {
  double bytes_per_s;
  double latency_s;
} CostLink;

typedef enum {
  COST_ALGO_RING, /* ring (pipelined chain for broadcast / reduce) */
  COST_ALGO_TREE, /* NCCL's double binary tree (all-reduce, broadcast, reduce) */
  COST_ALGO_AUTO  /* the faster of the two, as NCCL's tuner picks */
} CostAlgo;

typedef enum {
  COST_ALLREDUCE,
  COST_ALLGATHER,
  COST_REDUCE_SCATTER,
  COST_ALLTOALL,
  COST_BROADCAST,
  COST_REDUCE,
  COST_SENDRECV
} CostCollective;

const char *cost_collective_name(CostCollective c);

/* The factor of nccl-tests doc/PERFORMANCE.md: busbw = algbw * factor, with
 * algbw = S / t. 2(n-1)/n for all-reduce; (n-1)/n for all-gather,
 * reduce-scatter and all-to-all; 1 for broadcast, reduce and send/recv. */
double cost_busbw_factor(CostCollective c, int n);

/* Time of one collective over n ranks. `bytes` is S of nccl-tests: the
 * buffer of one rank for all-reduce, broadcast, reduce, send/recv; the whole
 * gathered array (n times one rank's shard) for all-gather and
 * reduce-scatter; one rank's whole send buffer for all-to-all. 0 when n <= 1
 * or bytes <= 0; INFINITY when the link has no bandwidth. All-gather,
 * reduce-scatter and all-to-all are ring (pairwise) only: TREE and AUTO
 * price them as RING, as NCCL does. */
double cost_allreduce_s(double bytes, int n, const CostLink *link, CostAlgo algo);
double cost_allgather_s(double bytes, int n, const CostLink *link, CostAlgo algo);
double cost_reduce_scatter_s(double bytes, int n, const CostLink *link, CostAlgo algo);
double cost_alltoall_s(double bytes, int n, const CostLink *link);
double cost_broadcast_s(double bytes, int n, const CostLink *link, CostAlgo algo);
double cost_reduce_s(double bytes, int n, const CostLink *link, CostAlgo algo);
/* One message from one rank to another (pipeline stages). */
double cost_sendrecv_s(double bytes, const CostLink *link);
/* Any of the above by kind (n is ignored for COST_SENDRECV). */
double cost_collective_s(CostCollective c, double bytes, int n, const CostLink *link, CostAlgo algo);
/* The algorithm AUTO resolves to for this message: RING or TREE. */
CostAlgo cost_pick_algo(CostCollective c, double bytes, int n, const CostLink *link);
/* Bytes one rank sends during the collective (comm_per_step of the plan).
 * AUTO counts as RING; resolve it with cost_pick_algo first if needed. */
double cost_collective_bytes_sent(CostCollective c, double bytes, int n, CostAlgo algo);

/* The link of a group of n ranks placed as `ranks_per_node` consecutive
 * ranks on each node of cluster c: how many of the group's ranks share a
 * node under the partitioner's rank order (tensor parallelism inside a node:
 * tp; the data-parallel group under Megatron's order, tp fastest, then dp,
 * then pp: min(dp, max(1, gpus_per_node / tp))).
 *   - The group fits in one node (n <= ranks_per_node): the intra-node
 *     fabric, times COST_NCCL_INTRA_EFFICIENCY.
 *   - It spans nodes: a ring crosses each node boundary once per channel,
 *     and the channels of the group's ranks_per_node GPUs leave the node
 *     through those GPUs' share of the NICs, so the bus bandwidth is
 *     ranks_per_node * nics_per_node * nic_bw / gpus_per_node (times
 *     COST_NCCL_INTER_EFFICIENCY), and never more than the intra-node
 *     figure. Latency is the inter-node one.
 * Assumes every GPU of a node is busy in a group of the same shape at the
 * same time (SPMD), so a group gets its own GPUs' share of the NICs and no
 * more. On a cluster whose ranks share one device (shared_device, the CPU
 * machine) the ranks of the node share the copy bandwidth. */
CostLink cost_group_link(const SemCluster *c, int n, int ranks_per_node);
/* The same for an all-to-all, whose traffic to other nodes leaves through
 * each rank's own NIC share (docs/planner.md sec. 2). dedup: the share of
 * the off-node copies that cross the network (1: NCCL's all-to-all, a copy
 * per destination rank; cost_node_dedup under a DeepEP-style dispatcher, a
 * copy per destination node forwarded to its ranks over the intra-node
 * fabric, which then carries those copies too). */
CostLink cost_alltoall_link(const SemCluster *c, int n, int ranks_per_node, double dedup);
/* A token routed to top_k of `experts` experts spread evenly over `nodes`
 * nodes, uniformly (balanced routing): the expected number of other nodes
 * holding at least one of its experts over its expected copies bound for
 * other nodes, N (1 - P0) / k with P0 = C(E - E/N, k) / C(E, k) the chance
 * that a node holds none (hypergeometric); 1 for one node or top_k 1. With
 * node-limited routing (its choices within group_top_k M of `groups` G
 * consecutive blocks of the experts; groups 1: none) at most the nodes that
 * hold one of its M groups, M' / k: M' = N (1 - C(G - G/N, M) / C(G, M)) where
 * a node holds G / N whole groups, M N / G where a group spans N / G nodes;
 * the smaller of the two. */
double cost_node_dedup(int64_t experts, int64_t top_k, int64_t nodes, int64_t groups, int64_t group_top_k);

/* ---- compute: roofline of one op ----
 *
 * max(flops / (peak(precision) * gemm_efficiency),
 *     bytes / (hbm_bandwidth * COST_HBM_EFFICIENCY)).
 * gemm_efficiency is 1 for ops that are not matrix multiplies (they are
 * memory bound anyway) and cost_gemm_efficiency() for those that are; a
 * value <= 0 or > 1 is taken as 1. INFINITY when flops > 0 and the device
 * has no such precision (cat_peak_flops() == 0). */
double cost_op_time_s(double flops, double bytes, const CatDevice *dev, const char *precision,
                      double gemm_efficiency);

/* Achievable fraction of dense peak for C[m,n] = A[m,k] B[k,n]:
 *   ceiling(dev) * tile quantization * wave quantization * k / (k + K0).
 * Tiles are COST_GEMM_TILE square; a wave is one tile per SM (CU) of the
 * device. The batched form has `batch` independent GEMMs of that shape in
 * one launch (attention scores), which fill the waves together. Dimensions
 * <= 0 give the ceiling. dev may be NULL (defaults). */
double cost_gemm_efficiency(int64_t m, int64_t n, int64_t k, const CatDevice *dev);
/* Split-K (CUTLASS's "split-K" / cuBLAS's, and cuDNN's weight-gradient
 * kernels): a GEMM of fewer output tiles than the device has SMs, with a deep
 * k, is cut into s slices of k computed side by side and summed after. s is
 * as many as fill one wave, each slice at least COST_GEMM_SPLIT_K_MIN deep;
 * 1 when the tiles fill the device already. A convolution's filter gradient
 * (k = images x positions) is such a GEMM. */
#define COST_GEMM_SPLIT_K_MIN 512
int64_t cost_gemm_split_k(int64_t batch, int64_t m, int64_t n, int64_t k, const CatDevice *dev);

double cost_gemm_efficiency_batched(int64_t batch, int64_t m, int64_t n, int64_t k,
                                    const CatDevice *dev);
/* The same at a precision: the depth term's K0 is cost_gemm_k_overhead(dev,
 * precision); the 16-bit precisions (and NULL) give the forms above. */
double cost_gemm_efficiency_prec(int64_t batch, int64_t m, int64_t n, int64_t k, const CatDevice *dev,
                                 const char *precision);
/* The same with K0 given (a caller pricing many GEMMs of one precision looks
 * it up once with cost_gemm_k_overhead). */
double cost_gemm_efficiency_k0(int64_t batch, int64_t m, int64_t n, int64_t k, const CatDevice *dev, double k0);
/* A flash attention kernel's GEMM over `batch` heads: an output tile of
 * [COST_GEMM_TILE query rows x the head size d], its mainloop k deep over
 * the keys. The kernels are compiled per head size in steps of
 * COST_FLASH_HEAD_STEP (FlashAttention-2: 32 to 256), so a head of 64 fills
 * its tile where a square one would be half empty: the waste is d's padding
 * to the step, not to COST_GEMM_TILE. docs/planner.md sec. 9.1. */
#define COST_FLASH_HEAD_STEP 32
double cost_flash_efficiency(int64_t batch, int64_t m, int64_t d, int64_t k, const CatDevice *dev);
/* K0 in elements of K at a precision: COST_GEMM_K_OVERHEAD times how much
 * faster than bf16 (fp16 where the device has no bf16) the precision's
 * dense peak is, never less than 1 x: FP8 on Hopper 128. */
double cost_gemm_k_overhead(const CatDevice *dev, const char *precision);
/* The ceiling and the SM / CU count used for dev (0 SMs: no wave model). */
double cost_gemm_ceiling(const CatDevice *dev);
/* The NVIDIA architecture generation of a catalog device (the table of
 * cost.c); COST_GEN_OTHER for every other device. */
typedef enum { COST_GEN_OTHER, COST_GEN_AMPERE, COST_GEN_HOPPER, COST_GEN_BLACKWELL } CostGpuGen;
CostGpuGen cost_gpu_generation(const CatDevice *dev);
/* Special-function results (exp) per second: the FP32 peak x 16 SFUs /
 * (2 x FP32 lanes) per SM (docs/planner.md sec. 3.3). 0 without a device. */
double cost_sfu_rate(const CatDevice *dev);
int cost_device_units(const CatDevice *dev);

/* SMs a DGX-class node's NCCL collectives hold (NVIDIA/nccl issue 689). */
#define COST_NCCL_SMS 16

/* The share of a GEMM's speed lost while a collective overlaps it: 0.5 on
 * Hopper / Blackwell (persistent GEMMs run in two waves), NCCL's SM share on
 * Ampere, 0 where not modelled (cost.c). A collective hidden for h seconds
 * behind compute adds slowdown x h to the step. */
double cost_overlap_slowdown(const CatDevice *dev);

/* ---- attention kernels (docs/planner.md sec. 9.1) ----
 * How `hpdlc plan --attention` prices a flash attention: the tile model
 * alone (COST_ATTN_TILED, `flash`, the default), or a kernel generation
 * whose published utilisation bounds it: FlashAttention-1 (Dao et al.
 * 2022), -2 (Dao 2023), -3 (Shah et al. 2024). */
typedef enum {
  COST_ATTN_TILED,
  COST_ATTN_FLASH1,
  COST_ATTN_FLASH2,
  COST_ATTN_FLASH3
} CostAttnKernel;

/* "flash", "flash1", "flash2", "flash3" */
const char *cost_attn_kernel_name(CostAttnKernel k);
/* The kernel of that name, or -1 when the name is none of them. */
int cost_attn_kernel_from_name(const char *name);
/* The share of the device's dense peak (for the run's precision) that
 * kernel k reaches at best, forward (backward = 0) or backward (1), from
 * the FlashAttention-2 and -3 papers (derived where unpublished; the table
 * in cost.c and docs/planner.md sec. 9.1 give each source). An attention
 * kernel then takes at least its FLOPs / (peak x this). 0 when there is no
 * figure (the tile model, or a device outside the Ampere, Hopper and
 * Blackwell families): the tile model alone prices it. */
double cost_attention_utilization(CostAttnKernel k, int backward, const CatDevice *dev);

/* ---- pipeline bubble (Narayanan et al. 2021, Sec 2.2) ----
 * cost_bubble_fraction: bubble time over ideal compute time,
 *   (p-1)/m for GPipe and 1F1B, (p-1)/(v m) for interleaved 1F1B.
 * cost_bubble_step_fraction: bubble time over the whole pipeline time
 *   (ideal + bubble), (p-1)/(m+p-1), resp. (p-1)/(v m + p-1): the share of
 *   the step a GPU idles, which is what the plan's time.bubble_fraction
 *   reports.
 * pp <= 1 gives 0; m < 1 counts as 1; v < 1 counts as 1 and is ignored
 * unless the schedule is interleaved. */
double cost_bubble_fraction(Schedule s, int pp, int64_t microbatches, int virtual_stages);
double cost_bubble_step_fraction(Schedule s, int pp, int64_t microbatches, int virtual_stages);

/* ---- model states (ZeRO paper, Rajbhandari et al. 2020, Sec 3.1 and 5) ----
 * Bytes per GPU of weights, gradients and optimizer state for `params`
 * parameters data-parallel over dp ranks with ZeRO stage 0..3.
 * Per parameter: mixed precision (bf16 / fp16) keeps 2 B weights + 2 B
 * gradients + K B optimizer state, K = 12 for Adam (fp32 master weights,
 * momentum, variance), 8 for SGD with momentum, 4 without; fp32 training
 * keeps 4 + 4 + K, K = 8 for Adam, 4 for SGD with momentum, 0 without.
 * Stage 1 divides the optimizer state by dp, stage 2 also the gradients,
 * stage 3 also the weights. */
typedef struct CostModelStates {
  double params, grads, optimizer, total;
} CostModelStates;

CostModelStates cost_model_states(int64_t params, int zero_stage, int dp, Precision p,
                                  OptimizerKind o, int sgd_momentum);
/* The same with the moments at moment_bytes a value (4: fp32, as above; 2:
 * train.moments = bf16, Megatron-Core's precision-aware optimizer with
 * exp_avg_dtype = exp_avg_sq_dtype = bf16, DeepSeek-V3's BF16 AdamW moments:
 * K = 8 for Adam under mixed precision). */
CostModelStates cost_model_states_m(int64_t params, int zero_stage, int dp, Precision p, OptimizerKind o,
                                    int sgd_momentum, int moment_bytes);
/* The total of cost_model_states; SGD is taken with a momentum buffer. */
double cost_model_state_bytes(int64_t params, int zero_stage, int dp, Precision p,
                              OptimizerKind o);

/* ---- reference formulas of Narayanan et al. 2021 (cross-checks) ----
 * For a GPT of l layers, hidden h, vocabulary V, sequence s, batch B. */
/* Eq. 2: parameters, 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)). */
double cost_megatron_params(int64_t l, int64_t h, int64_t V, int64_t s);
/* Eq. 3: FLOPs of one iteration including the recomputed forward of full
 * activation recomputation, 96 B s l h^2 (1 + s/(6h) + V/(16 l h)). */
double cost_megatron_flops(int64_t B, int64_t s, int64_t l, int64_t h, int64_t V);
/* The same without recomputation (model FLOPs, the numerator of MFU):
 * 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) (Korthikanti et al. 2022, App. A). */
double cost_megatron_model_flops(int64_t B, int64_t s, int64_t l, int64_t h, int64_t V);
/* Achieved FLOP/s per GPU as the paper reports it: F / (T n). */
double cost_achieved_flops_per_gpu(double flops_per_iter, double iter_s, int64_t gpus);
/* Eq. 4: end-to-end training time ~ 8 T P / (n X) for T tokens, P params,
 * n GPUs at X FLOP/s each. */
double cost_training_time_s(double tokens, double params, int64_t gpus, double flops_per_gpu);

/* ---- scaling laws ---- */
/* Amdahl (1967): S(n) = 1 / (f + (1-f)/n). */
double cost_amdahl_speedup(double serial_fraction, double n);
/* Gustafson (1988): scaled speed-up S(n) = n - f (n-1). */
double cost_gustafson_speedup(double serial_fraction, double n);
/* Karp-Flatt (1990): the serial fraction one (n, S) point implies,
 * (1/S - 1/n) / (1 - 1/n); 0 for n <= 1. */
double cost_karp_flatt(double speedup, double n);
/* Least-squares serial fraction f of Amdahl's law from `count` measured
 * (n, speed-up) points: minimises sum (1/S - f - (1-f)/n)^2, i.e. the
 * regression through the origin of y = 1/S - 1/n on x = 1 - 1/n. Clamped to
 * [0, 1]; 0 when no point has n > 1. */
double cost_amdahl_fit(const double *n, const double *speedup, int count);

#endif
