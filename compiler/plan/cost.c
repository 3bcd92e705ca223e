/* cost.c - the cost primitives of the planner (see cost.h, docs/planner.md).
 *
 * Pure functions of their arguments plus one constant table (the GEMM
 * figures per device below). Nothing here allocates, so the planner can call
 * them millions of times in a layout search. */
#include "cost.h"

#include <math.h>
#include <string.h>

/* "Never finishes": a time for work the hardware cannot do (no bandwidth,
 * no such precision). INFINITY is a float; say double once here. */
#define NEVER ((double)INFINITY)

/* ------------------------------------------------------------------ */
/* collectives                                                          */

const char *cost_collective_name(CostCollective c) {
  switch (c) {
  case COST_ALLREDUCE: return "all-reduce";
  case COST_ALLGATHER: return "all-gather";
  case COST_REDUCE_SCATTER: return "reduce-scatter";
  case COST_ALLTOALL: return "all-to-all";
  case COST_BROADCAST: return "broadcast";
  case COST_REDUCE: return "reduce";
  case COST_SENDRECV: return "send/recv";
  }
  return "?";
}

/* nccl-tests doc/PERFORMANCE.md: the factor that turns the algorithm
 * bandwidth S/t into a bus bandwidth comparable with the hardware link. */
double cost_busbw_factor(CostCollective c, int n) {
  if (n < 1) n = 1;
  switch (c) {
  case COST_ALLREDUCE: return 2.0 * (n - 1) / n;
  case COST_ALLGATHER:
  case COST_REDUCE_SCATTER:
  case COST_ALLTOALL: return (double)(n - 1) / n;
  case COST_BROADCAST:
  case COST_REDUCE:
  case COST_SENDRECV: return 1.0;
  }
  return 1.0;
}

/* ceil(log2(n)) for n >= 1: the depth of a binary tree over n ranks. */
static int ceil_log2(int n) {
  int d = 0;
  int64_t span = 1;
  while (span < n) {
    span *= 2;
    d++;
  }
  return d;
}

/* Only all-reduce, broadcast and reduce have a tree algorithm in NCCL; the
 * others run as rings (pairwise exchanges for all-to-all). */
static int has_tree(CostCollective c) {
  return c == COST_ALLREDUCE || c == COST_BROADCAST || c == COST_REDUCE;
}

/* Time of collective c with an explicit algorithm (RING or TREE):
 *   steps * latency + S * factor / busbw
 * where factor is the nccl-tests bus-bandwidth factor for rings (so that a
 * zero-latency ring reproduces busbw exactly) and, for NCCL's double binary
 * tree, the data each rank moves: 2S for all-reduce (a reduce then a
 * broadcast, each half of the data on each of two trees), S for broadcast
 * and reduce. Steps: 2(n-1) for a ring all-reduce (reduce-scatter then
 * all-gather), n-1 for the other rings, 2 ceil(log2 n) for a tree
 * all-reduce (up then down), ceil(log2 n) for a tree broadcast / reduce. */
static double coll_time(CostCollective c, double bytes, int n, const CostLink *link, CostAlgo algo) {
  if (c == COST_SENDRECV) n = 2;
  if (n <= 1 || !(bytes > 0)) return 0;
  if (!link || !(link->bytes_per_s > 0)) return NEVER;
  double bw = link->bytes_per_s;
  double lat = link->latency_s > 0 ? link->latency_s : 0;
  int tree = algo == COST_ALGO_TREE && has_tree(c);
  switch (c) {
  case COST_ALLREDUCE:
    if (tree) return 2.0 * ceil_log2(n) * lat + 2.0 * bytes / bw;
    return 2.0 * (n - 1) * lat + bytes * cost_busbw_factor(c, n) / bw;
  case COST_ALLGATHER:
  case COST_REDUCE_SCATTER:
  case COST_ALLTOALL: return (double)(n - 1) * lat + bytes * cost_busbw_factor(c, n) / bw;
  case COST_BROADCAST:
  case COST_REDUCE:
    if (tree) return ceil_log2(n) * lat + bytes / bw;
    return (double)(n - 1) * lat + bytes / bw;
  case COST_SENDRECV: return lat + bytes / bw;
  }
  return 0;
}

CostAlgo cost_pick_algo(CostCollective c, double bytes, int n, const CostLink *link) {
  if (!has_tree(c)) return COST_ALGO_RING;
  return coll_time(c, bytes, n, link, COST_ALGO_TREE) < coll_time(c, bytes, n, link, COST_ALGO_RING)
             ? COST_ALGO_TREE
             : COST_ALGO_RING;
}

double cost_collective_s(CostCollective c, double bytes, int n, const CostLink *link, CostAlgo algo) {
  if (algo == COST_ALGO_AUTO) algo = cost_pick_algo(c, bytes, n, link);
  return coll_time(c, bytes, n, link, algo);
}

double cost_allreduce_s(double bytes, int n, const CostLink *link, CostAlgo algo) {
  return cost_collective_s(COST_ALLREDUCE, bytes, n, link, algo);
}
double cost_allgather_s(double bytes, int n, const CostLink *link, CostAlgo algo) {
  return cost_collective_s(COST_ALLGATHER, bytes, n, link, algo);
}
double cost_reduce_scatter_s(double bytes, int n, const CostLink *link, CostAlgo algo) {
  return cost_collective_s(COST_REDUCE_SCATTER, bytes, n, link, algo);
}
double cost_alltoall_s(double bytes, int n, const CostLink *link) {
  return cost_collective_s(COST_ALLTOALL, bytes, n, link, COST_ALGO_RING);
}
double cost_broadcast_s(double bytes, int n, const CostLink *link, CostAlgo algo) {
  return cost_collective_s(COST_BROADCAST, bytes, n, link, algo);
}
double cost_reduce_s(double bytes, int n, const CostLink *link, CostAlgo algo) {
  return cost_collective_s(COST_REDUCE, bytes, n, link, algo);
}
double cost_sendrecv_s(double bytes, const CostLink *link) {
  return cost_collective_s(COST_SENDRECV, bytes, 2, link, COST_ALGO_RING);
}

/* What one rank puts on the wire: the bandwidth terms of coll_time times the
 * link bandwidth. */
double cost_collective_bytes_sent(CostCollective c, double bytes, int n, CostAlgo algo) {
  if (c == COST_SENDRECV) return bytes > 0 ? bytes : 0;
  if (n <= 1 || !(bytes > 0)) return 0;
  int tree = algo == COST_ALGO_TREE && has_tree(c);
  switch (c) {
  case COST_ALLREDUCE: return tree ? 2.0 * bytes : bytes * cost_busbw_factor(c, n);
  case COST_ALLGATHER:
  case COST_REDUCE_SCATTER:
  case COST_ALLTOALL: return bytes * cost_busbw_factor(c, n);
  case COST_BROADCAST:
  case COST_REDUCE:
  case COST_SENDRECV: return bytes;
  }
  return 0;
}

/* The two-level model of cost.h / docs/planner.md "Links of a group". A
 * ring over N nodes x r ranks crosses each node boundary once per channel;
 * the per-rank traffic of the ring, 2(n-1)/n S for an all-reduce, is also
 * what leaves each node. NCCL spreads channels over the NICs nearest to the
 * group's GPUs, so a group with r ranks per node sends through r GPUs' share
 * of the node's NICs: r * nics * nic_bw / gpus_per_node. The other
 * gpus_per_node / r GPUs of the node are busy with their own groups (SPMD)
 * and use the rest. Matches nccl-tests on 8 x A100 nodes with 4 HDR NICs:
 * 8 * 4 * 25 / 8 = 100 GB/s line rate, 85-86 GB/s measured (#119, #1048). */
CostLink cost_group_link(const SemCluster *c, int n, int ranks_per_node) {
  CostLink l = {0, 0};
  if (!c) return l;
  int gpn = c->gpus_per_node > 0 ? (int)c->gpus_per_node : 1;
  int r = ranks_per_node < 1 ? 1 : ranks_per_node;
  if (r > gpn) r = gpn;
  if (n >= 1 && r > n) r = n;
  /* Ranks that time-share one device (CPU cores) copy through the same
   * memory: the node's copy bandwidth is split between all its ranks. No
   * NCCL fraction: the figure is already a memory-copy estimate. */
  double intra = c->shared_device ? c->intra_bytes_per_s / gpn
                                  : c->intra_bytes_per_s * COST_NCCL_INTRA_EFFICIENCY;
  if (intra < 0) intra = 0;
  /* ranks of a shared device are all on its one machine, whatever "nodes" a
   * layout counts them in (their network would be none: an infinite time) */
  if (n <= r || c->shared_device) {
    l.bytes_per_s = intra;
    l.latency_s = c->intra_latency_s;
    return l;
  }
  double nic_share = c->nics_per_node > 0 && c->inter_bytes_per_s > 0
                         ? (double)c->nics_per_node * c->inter_bytes_per_s / gpn
                         : 0;
  double inter = r * nic_share * COST_NCCL_INTER_EFFICIENCY;
  /* With r > 1 the ring also hops between the r GPUs of a node; with r == 1
   * it never does, so the intra-node fabric does not limit it. */
  l.bytes_per_s = r > 1 && intra < inter ? intra : inter;
  l.latency_s = c->inter_latency_s > c->intra_latency_s ? c->inter_latency_s : c->intra_latency_s;
  return l;
}

/* cost.h: hypergeometric, the experts of each node as one group. */
/* C(a - b, m) / C(a, m): the chance that m of a items drawn miss b given ones. */
static double miss_all(double a, double b, int64_t m) {
  double p = 1;
  for (int64_t i = 0; i < m; i++) {
    double num = a - b - (double)i;
    p *= num > 0 ? num / (a - (double)i) : 0;
  }
  return p;
}

double cost_node_dedup(int64_t experts, int64_t top_k, int64_t nodes, int64_t groups, int64_t group_top_k) {
  if (nodes <= 1 || top_k <= 1 || experts < nodes || top_k > experts) return 1;
  double d = (double)nodes * (1 - miss_all((double)experts, (double)experts / (double)nodes, top_k)) / (double)top_k;
  if (groups > 1 && group_top_k >= 1 && group_top_k < groups) {
    double reach = -1; /* the nodes holding one of the token's groups */
    if (groups % nodes == 0)
      reach = (double)nodes * (1 - miss_all((double)groups, (double)(groups / nodes), group_top_k));
    else if (nodes % groups == 0)
      reach = (double)group_top_k * (double)(nodes / groups);
    if (reach > 0 && reach / (double)top_k < d) d = reach / (double)top_k;
  }
  return d < 1 ? d : 1;
}

/* The link an all-to-all of n ranks sees, r of them a node: NCCL's
 * all-to-all is n - 1 concurrent sends a rank, the (n - r) / n of its buffer
 * bound for other nodes through its own NIC (an all-to-all cannot aggregate
 * the bandwidth of several NICs: NVIDIA/nccl-tests issue 267) and the
 * (r - 1) / n for its node's GPUs over the intra-node fabric at the same
 * time. As a bus bandwidth for the (n - 1) / n S of sec. 1:
 * (n - 1) / max((n - r) / nic, (r - 1) / intra). In a node, the group's link.
 * Deduplicated per node (dedup < 1, DeepEP's normal kernels): dedup (n - r)
 * over the NIC, and (r - 1) + (n - r) (r - 1) / r over the intra-node fabric. */
CostLink cost_alltoall_link(const SemCluster *c, int n, int ranks_per_node, double dedup) {
  CostLink l = cost_group_link(c, n, ranks_per_node);
  if (!c || c->shared_device) return l;
  int gpn = c->gpus_per_node > 0 ? (int)c->gpus_per_node : 1;
  int r = ranks_per_node < 1 ? 1 : ranks_per_node;
  if (r > gpn) r = gpn;
  if (n <= r) return l;
  double nic = c->nics_per_node > 0 && c->inter_bytes_per_s > 0
                   ? (double)c->nics_per_node * c->inter_bytes_per_s / gpn * COST_NCCL_INTER_EFFICIENCY
                   : 0;
  double intra = c->intra_bytes_per_s * COST_NCCL_INTRA_EFFICIENCY;
  if (nic <= 0) {
    l.bytes_per_s = 0;
    return l;
  }
  if (!(dedup > 0) || dedup > 1) dedup = 1;
  /* deduplicated, the off-node copies that arrive at one rank of a node are
   * forwarded to the others over the intra-node fabric, concurrently */
  double on = (double)(r - 1) + (dedup < 1 ? (double)(n - r) * (r - 1) / r : 0);
  double t_off = dedup * (double)(n - r) / nic, t_on = intra > 0 ? on / intra : 0;
  l.bytes_per_s = (double)(n - 1) / (t_off > t_on ? t_off : t_on);
  return l;
}

/* ------------------------------------------------------------------ */
/* compute                                                              */

double cost_op_time_s(double flops, double bytes, const CatDevice *dev, const char *precision,
                      double gemm_efficiency) {
  int work = flops > 0 || bytes > 0;
  if (!dev) return work ? NEVER : 0;
  double eff = gemm_efficiency > 0 && gemm_efficiency <= 1 ? gemm_efficiency : 1;
  double peak = cat_peak_flops(dev, precision);
  double t_compute = 0, t_memory = 0;
  if (flops > 0) t_compute = peak > 0 ? flops / (peak * eff) : NEVER;
  if (bytes > 0)
    t_memory = dev->hbm_bytes_per_s > 0 ? bytes / (dev->hbm_bytes_per_s * COST_HBM_EFFICIENCY) : NEVER;
  return t_compute > t_memory ? t_compute : t_memory;
}

/* GEMM figures per device (canonical catalog names).
 *   units:   SMs (NVIDIA) or CUs (AMD) that a GEMM's tiles are spread over;
 *            0 = no wave model (TPU: XLA's own tiling; CPU: BLAS threads).
 *   tile:    output tile edge; 0 = COST_GEMM_TILE.
 *   ceiling: the k -> infinity efficiency of a perfectly tiled GEMM,
 *            calibrated so that this model at the best shape of the
 *            "Maximum Achievable Matmul FLOPS" table of S. Bekman's
 *            ml-engineering (compute/accelerator, bf16, measured with
 *            mamf-finder) gives the measured rate over the catalog peak:
 *              A100 SXM  267.9 / 312    at 6912x16384x2048  -> 0.886
 *              H100 SXM  792.1 / 989.4  at 6144x17920x2816  -> 0.820
 *              MI250X    147.0 / 191.5  at 1024x14080x19968 -> 0.770 (1 GCD)
 *              MI300X    781.9 / 1307.4 at 4096x10240x4864  -> 0.648
 *            and the table's later version (torch 2.7-2.10, CUDA 12.8-13.0):
 *              B200      1745.0 / 2250  at 1792x16128x3072  -> 0.797
 *              GB200     1822.0 / 2500  at 4096x9728x2048   -> 0.778
 *              B300      1769.0 / 2250  at 12288x18432x1024 -> 0.841
 *            GB300 (not measured): B300 x GB200 / B200 -> 0.821.
 *            tests/unit/test_cost.c checks those seven points.
 * SM / CU counts: A100 108 SMs, H100 SXM5 132, H100 PCIe 114 (NVIDIA H100
 * whitepaper); H200 is the H100 SXM die; B200 148 (two dies of 74, NVIDIA
 * Blackwell material, less certain); MI250X 2 x 110 CUs, MI300X 304 CUs
 * (ROCm MI200 / MI300 guides); T4 40 SMs (Turing whitepaper). H200 takes
 * the H100 ceiling (same die, same 700 W limit); devices without a
 * measurement take COST_GEMM_CEILING_DEFAULT. */
/* The NVIDIA architecture families the attention kernels' published
 * figures are for (cost_attention_utilization, cost_gpu_generation); COST_GEN_OTHER has none. */

typedef struct {
  const char *device;
  int units;
  int tile;
  double ceiling;
  int fp32_lanes; /* FP32 lanes per SM (CU) next to its 16 special-function units; 0: no SFU model */
  CostGpuGen family;
  double sfu_rate; /* exponentials/s where published for the device; 0: from fp32_lanes */
} GemmSpec;

static const GemmSpec gemm_specs[] = {
    {"a100-40gb", 108, 0, 0.886, 64, COST_GEN_AMPERE, 0},
    {"a100-80gb", 108, 0, 0.886, 64, COST_GEN_AMPERE, 0},
    {"h100-sxm", 132, 0, 0.820, 128, COST_GEN_HOPPER, 0},
    {"h100-pcie", 114, 0, 0.820, 128, COST_GEN_HOPPER, 0},
    {"h200", 132, 0, 0.820, 128, COST_GEN_HOPPER, 0},
    {"b200", 148, 0, 0.797, 128, COST_GEN_BLACKWELL, 0},
    /* GB200's GPU is a B200 (148 SMs) at a higher power limit */
    {"gb200", 148, 0, 0.778, 128, COST_GEN_BLACKWELL, 0},
    /* Blackwell Ultra: 160 SMs, and twice Blackwell's special-function
     * throughput for attention's exponentials ("Inside NVIDIA Blackwell
     * Ultra", NVIDIA technical blog, 2025: 10.7 TeraExponentials/s against
     * Blackwell's 5) */
    {"gb300", 160, 0, 0.821, 128, COST_GEN_BLACKWELL, 10.7e12},
    /* the HGX part of Blackwell Ultra: the same SMs and special-function rate */
    {"b300", 160, 0, 0.841, 128, COST_GEN_BLACKWELL, 10.7e12},
    {"mi250x", 220, 0, 0.770, 0, COST_GEN_OTHER, 0},
    {"mi250x-gcd", 110, 0, 0.770, 0, COST_GEN_OTHER, 0},
    {"mi300x", 304, 0, 0.648, 0, COST_GEN_OTHER, 0},
    /* the MI300X's compute dies: its measured ceiling */
    {"mi325x", 304, 0, 0.648, 0, COST_GEN_OTHER, 0},
    {"t4", 40, 0, COST_GEMM_CEILING_DEFAULT, 64, COST_GEN_OTHER, 0},
    /* MXUs are 128x128 systolic arrays, so operands pad to 128. */
    {"tpu-v5p", 0, 128, COST_GEMM_CEILING_DEFAULT, 0, COST_GEN_OTHER, 0},
    /* BLAS micro-kernels are a few rows wide: no tile or wave penalty. */
    {"cpu", 0, 1, COST_GEMM_CEILING_DEFAULT, 0, COST_GEN_OTHER, 0},
};

static const GemmSpec gemm_default = {"", 0, 0, COST_GEMM_CEILING_DEFAULT, 0, COST_GEN_OTHER, 0};

static const GemmSpec *gemm_spec(const CatDevice *dev) {
  if (!dev || !dev->name) return &gemm_default;
  /* the last device found first: a search prices one device hundreds of
   * thousands of times (the check is against the table's own name) */
  static _Thread_local const GemmSpec *last;
  if (last && !strcmp(last->device, dev->name)) return last;
  for (size_t i = 0; i < sizeof gemm_specs / sizeof gemm_specs[0]; i++)
    if (!strcmp(gemm_specs[i].device, dev->name)) return last = &gemm_specs[i];
  return &gemm_default;
}

double cost_gemm_ceiling(const CatDevice *dev) { return gemm_spec(dev)->ceiling; }

CostGpuGen cost_gpu_generation(const CatDevice *dev) { return gemm_spec(dev)->family; }

/* An NVIDIA SM has 16 special-function units (exp2, rsqrt, ...: one result
 * per unit per clock) beside its FP32 lanes, which do one FMA (2 FLOP) per
 * clock: the SFU rate is the FP32 peak x 16 / (2 lanes) (Ampere GA100 and
 * Hopper GH100 whitepapers: 64 and 128 FP32 lanes per SM). H100 SXM:
 * 66.9 TFLOP/s x 16 / 256 = 4.2e12 exponentials/s, the 3.9 TFLOPS "special
 * functions" of the FlashAttention-3 paper (Shah et al. 2024, sec. 3). A
 * device without the figure uses its vector rate / 16. */
double cost_sfu_rate(const CatDevice *dev) {
  if (!dev) return 0;
  const GemmSpec *g = gemm_spec(dev);
  double fp32 = dev->peak_flops_fp32;
  if (g->sfu_rate > 0) return g->sfu_rate;
  if (!(fp32 > 0)) return 0;
  return g->fp32_lanes > 0 ? fp32 * 16.0 / (2.0 * g->fp32_lanes) : fp32 / 16.0;
}
/* The device's SMs: a cluster's own figure (CatDevice.sms) or the table's. */
static int spec_units(const CatDevice *dev, const GemmSpec *g) { return dev && dev->sms > 0 ? dev->sms : g->units; }

int cost_device_units(const CatDevice *dev) { return spec_units(dev, gemm_spec(dev)); }

/* The share of its speed a GEMM loses while a collective runs beside it on
 * another stream (docs/planner.md sec. 11.4a). NCCL's kernels hold whole SMs
 * for their duration (a DGX-class node's collectives use about 16: NVIDIA/
 * nccl issue 689, S. Jeaugey). On Hopper and Blackwell cuBLAS's GEMMs are
 * persistent, one CTA per SM working through the tiles: with SMs taken the
 * CTAs that do not fit wait for a second wave and the GEMM takes twice as
 * long while the collective runs (pytorch/pytorch issue 143988, FSDP on
 * H100: "matmuls take 2x as long ... when overlapped with a NCCL kernel";
 * PR 144974's sm_carveout), so half its speed is lost: 0.5. Earlier GPUs
 * schedule a GEMM's many CTAs on whatever SMs are free: it loses NCCL's
 * share, 16 / SMs (A100: 0.148). 0 where there is no SM model (CPUs, TPUs,
 * AMD: not measured). */
double cost_overlap_slowdown(const CatDevice *dev) {
  const GemmSpec *g = gemm_spec(dev);
  if (g->family == COST_GEN_HOPPER || g->family == COST_GEN_BLACKWELL) return 0.5;
  int units = spec_units(dev, g);
  if (g->family == COST_GEN_AMPERE && units > 0) return COST_NCCL_SMS / (double)units;
  return 0;
}

/* ------------------------------------------------------------------ */
/* attention kernels                                                    */

const char *cost_attn_kernel_name(CostAttnKernel k) {
  switch (k) {
  case COST_ATTN_TILED: return "flash";
  case COST_ATTN_FLASH1: return "flash1";
  case COST_ATTN_FLASH2: return "flash2";
  case COST_ATTN_FLASH3: return "flash3";
  }
  return "?";
}

int cost_attn_kernel_from_name(const char *name) {
  for (int k = COST_ATTN_TILED; name && k <= COST_ATTN_FLASH3; k++)
    if (!strcmp(name, cost_attn_kernel_name((CostAttnKernel)k))) return k;
  return -1;
}

/* The best published share of the dense peak of each kernel (the "up to"
 * figures, reached at long sequences and head size 128: an attention kernel
 * is never faster than that). A = A100 SXM (312 TFLOP/s bf16), H = H100
 * SXM (989). FA2 = Dao 2023, arXiv 2307.08691; FA3 = Shah et al. 2024,
 * arXiv 2407.08608. */
/* FA2 sec. 1: FlashAttention's forward "only reaches 30-50%" of A100 peak
 * (Fig. 5), its backward "only 25-35%" (Fig. 6); the abstract's 25-40%. */
#define FA1_A_FWD 0.50
#define FA1_A_BWD 0.35
/* FA2 sec. 1 and 4: FlashAttention-2 "up to 73%" of A100 peak forward
 * (230 TFLOP/s), "up to 63%" backward. */
#define FA2_A_FWD 0.73
#define FA2_A_BWD 0.63
/* FA3 abstract and sec. 1: FlashAttention-2 "only 35% utilization on the
 * H100". */
#define FA2_H_FWD 0.35
/* FA2 sec. 4.1: the same kernels on H100 "up to 335 TFLOPs/s" forward +
 * backward (Fig. 7 / 8); the backward has 2.5x the forward's FLOPs, so with
 * the forward at FA2_H_FWD: 2.5 / (3.5 / (335 / 989.4) - 1 / 0.35) = 0.334. */
#define FA2_H_BWD (2.5 / (3.5 / (335.0 / 989.4) - 1.0 / FA2_H_FWD))
/* FA3 abstract and sec. 4: FlashAttention-3 "up to 740 TFLOPs/s, 75%" of
 * H100 peak forward; sec. 4.1: "1.5-1.75x faster [than FlashAttention-2]
 * in the backward pass", the upper end taken as the others are. */
#define FA3_H_FWD 0.75
#define FA3_H_BWD (FA2_H_BWD * 1.75)
/* Not published: FlashAttention-1 on Hopper. Like FlashAttention-2 there
 * (FA2 sec. 4.1: "no special instructions ... such as TMA and 4th-gen Tensor
 * Cores") it uses none of Hopper's new instructions, so it is taken to keep
 * the share of peak FlashAttention-2 keeps going from A100 to H100:
 * FA1 on A100 x FA2 H100 / FA2 A100 (0.240 forward, 0.186 backward). */
#define FA1_H_FWD (FA1_A_FWD * FA2_H_FWD / FA2_A_FWD)
#define FA1_H_BWD (FA1_A_BWD * FA2_H_BWD / FA2_A_BWD)

/* [kernel - 1][Ampere, Hopper][forward, backward]. FlashAttention-3 is
 * Hopper-only (wgmma, TMA): on Ampere it is priced as FlashAttention-2, the
 * newest generation that runs there. Blackwell has no published figure for
 * any of the three; it takes Hopper's (the newest family with figures).
 * Other devices (AMD, TPU, CPU, T4, an unknown name) have none: 0, the tile
 * model alone. */
static const double attn_utilization[3][2][2] = {
    {{FA1_A_FWD, FA1_A_BWD}, {FA1_H_FWD, FA1_H_BWD}},
    {{FA2_A_FWD, FA2_A_BWD}, {FA2_H_FWD, FA2_H_BWD}},
    {{FA2_A_FWD, FA2_A_BWD}, {FA3_H_FWD, FA3_H_BWD}},
};

double cost_attention_utilization(CostAttnKernel k, int backward, const CatDevice *dev) {
  if (k < COST_ATTN_FLASH1 || k > COST_ATTN_FLASH3 || !dev) return 0;
  CostGpuGen f = gemm_spec(dev)->family;
  if (f == COST_GEN_OTHER) return 0;
  int hopper = f != COST_GEN_AMPERE; /* Hopper, or Blackwell priced as Hopper */
  return attn_utilization[k - COST_ATTN_FLASH1][hopper][backward != 0];
}

/* Efficiency = ceiling * tile quantization * wave quantization * depth:
 *   tile:  m n / (ceil(m/T) T ceil(n/T) T), the useful share of the padded
 *          output tiles;
 *   wave:  tiles / (ceil(tiles/units) units), the busy share of the last
 *          wave of thread blocks (one tile per SM at a time);
 *   depth: k / (k + K0), the mainloop's share of a tile's time.
 * NVIDIA's "Matrix Multiplication Background" guide (Deep Learning
 * Performance documentation) describes tile and wave quantization. */
double cost_gemm_k_overhead(const CatDevice *dev, const char *precision) {
  if (!dev || !precision) return COST_GEMM_K_OVERHEAD;
  double p = cat_peak_flops(dev, precision), p16 = cat_peak_flops(dev, "bf16");
  if (p16 <= 0) p16 = cat_peak_flops(dev, "fp16");
  return p > p16 && p16 > 0 ? COST_GEMM_K_OVERHEAD * p / p16 : COST_GEMM_K_OVERHEAD;
}

double cost_gemm_efficiency_k0(int64_t batch, int64_t m, int64_t n, int64_t k, const CatDevice *dev, double k0) {
  const GemmSpec *g = gemm_spec(dev);
  if (batch <= 0 || m <= 0 || n <= 0 || k <= 0) return g->ceiling;
  double t = g->tile > 0 ? g->tile : COST_GEMM_TILE;
  double tm = ceil((double)m / t), tn = ceil((double)n / t);
  double tile_eff = ((double)m * (double)n) / (tm * t * tn * t);
  double wave_eff = 1;
  int units = spec_units(dev, g);
  if (units > 0) {
    double tiles = (double)batch * tm * tn;
    double waves = ceil(tiles / units);
    wave_eff = tiles / (waves * units);
  }
  double depth_eff = (double)k / ((double)k + k0);
  return g->ceiling * tile_eff * wave_eff * depth_eff;
}

double cost_gemm_efficiency_batched(int64_t batch, int64_t m, int64_t n, int64_t k,
                                    const CatDevice *dev) {
  return cost_gemm_efficiency_k0(batch, m, n, k, dev, COST_GEMM_K_OVERHEAD);
}

double cost_flash_efficiency(int64_t batch, int64_t m, int64_t d, int64_t k, const CatDevice *dev) {
  if (d <= 0) return cost_gemm_efficiency_batched(batch, m, d, k, dev);
  double padded = COST_FLASH_HEAD_STEP * ceil((double)d / COST_FLASH_HEAD_STEP);
  /* tiles as wide as the padded head (over COST_GEMM_TILE: as many square
   * tiles' work), each full but for the padding */
  int64_t width = (int64_t)(COST_GEMM_TILE * ceil(padded / COST_GEMM_TILE));
  return cost_gemm_efficiency_batched(batch, m, width, k, dev) * (double)d / padded;
}

double cost_gemm_efficiency_prec(int64_t batch, int64_t m, int64_t n, int64_t k, const CatDevice *dev,
                                 const char *precision) {
  return cost_gemm_efficiency_k0(batch, m, n, k, dev, cost_gemm_k_overhead(dev, precision));
}

int64_t cost_gemm_split_k(int64_t batch, int64_t m, int64_t n, int64_t k, const CatDevice *dev) {
  const GemmSpec *g = gemm_spec(dev);
  int units = spec_units(dev, g);
  if (batch <= 0 || m <= 0 || n <= 0 || k <= 0 || units <= 0) return 1;
  double t = g->tile > 0 ? g->tile : COST_GEMM_TILE;
  double tiles = (double)batch * ceil((double)m / t) * ceil((double)n / t);
  if (tiles >= units) return 1;
  int64_t by_units = (int64_t)((double)units / tiles), by_depth = k / COST_GEMM_SPLIT_K_MIN;
  int64_t s = by_units < by_depth ? by_units : by_depth;
  return s > 1 ? s : 1;
}

double cost_gemm_efficiency(int64_t m, int64_t n, int64_t k, const CatDevice *dev) {
  return cost_gemm_efficiency_batched(1, m, n, k, dev);
}

/* ------------------------------------------------------------------ */
/* pipeline bubble: Narayanan et al. 2021, Sec 2.2.1 (GPipe, 1F1B) and     */
/* Sec 2.2.2 (interleaved): t_bubble / t_ideal = (p-1)/m, resp. (p-1)/(v m) */

static double bubble_denominator(Schedule s, int64_t m, int v) {
  if (m < 1) m = 1;
  if (v < 1) v = 1;
  return s == SCHED_INTERLEAVED ? (double)v * (double)m : (double)m;
}

double cost_bubble_fraction(Schedule s, int pp, int64_t microbatches, int virtual_stages) {
  if (pp <= 1) return 0;
  return (pp - 1) / bubble_denominator(s, microbatches, virtual_stages);
}

/* x = bubble/ideal  =>  bubble/(ideal + bubble) = x/(1+x) = (p-1)/(d+p-1). */
double cost_bubble_step_fraction(Schedule s, int pp, int64_t microbatches, int virtual_stages) {
  if (pp <= 1) return 0;
  return (pp - 1) / (bubble_denominator(s, microbatches, virtual_stages) + (pp - 1));
}

/* ------------------------------------------------------------------ */
/* model states: ZeRO paper (Rajbhandari et al. 2020) Sec 3.1, 5.1-5.3     */

CostModelStates cost_model_states(int64_t params, int zero_stage, int dp, Precision p,
                                  OptimizerKind o, int sgd_momentum) {
  return cost_model_states_m(params, zero_stage, dp, p, o, sgd_momentum, 4);
}

CostModelStates cost_model_states_m(int64_t params, int zero_stage, int dp, Precision p, OptimizerKind o,
                                    int sgd_momentum, int moment_bytes) {
  CostModelStates s = {0, 0, 0, 0};
  double psi = params > 0 ? (double)params : 0;
  double nd = dp > 1 ? dp : 1;
  int stage = zero_stage < 0 ? 0 : zero_stage > 3 ? 3 : zero_stage;
  int mixed = p != PREC_FP32;
  /* Mixed precision: 16-bit weights and gradients; the optimizer keeps an
   * fp32 master copy (4) plus its moments (fp32, or bf16 under moments =
   * bf16: moment_bytes). fp32: no master copy. */
  double w = mixed ? 2 : 4, g = mixed ? 2 : 4;
  double moments = (o == OPT_ADAMW ? 2 : sgd_momentum ? 1 : 0) * (double)moment_bytes;
  double k = (mixed ? 4 : 0) + moments;
  s.params = psi * w / (stage >= 3 ? nd : 1);
  s.grads = psi * g / (stage >= 2 ? nd : 1);
  s.optimizer = psi * k / (stage >= 1 ? nd : 1);
  s.total = s.params + s.grads + s.optimizer;
  return s;
}

double cost_model_state_bytes(int64_t params, int zero_stage, int dp, Precision p,
                              OptimizerKind o) {
  return cost_model_states(params, zero_stage, dp, p, o, 1).total;
}

/* ------------------------------------------------------------------ */
/* reference formulas: Narayanan et al. 2021, Eq. 2-4                     */

double cost_megatron_params(int64_t l, int64_t h, int64_t V, int64_t s) {
  double L = (double)l, H = (double)h;
  return 12.0 * L * H * H * (1.0 + 13.0 / (12.0 * H) + ((double)V + (double)s) / (12.0 * L * H));
}

double cost_megatron_flops(int64_t B, int64_t s, int64_t l, int64_t h, int64_t V) {
  double S = (double)s, L = (double)l, H = (double)h;
  return 96.0 * (double)B * S * L * H * H * (1.0 + S / (6.0 * H) + (double)V / (16.0 * L * H));
}

double cost_megatron_model_flops(int64_t B, int64_t s, int64_t l, int64_t h, int64_t V) {
  double S = (double)s, L = (double)l, H = (double)h;
  return 72.0 * (double)B * S * L * H * H * (1.0 + S / (6.0 * H) + (double)V / (12.0 * L * H));
}

double cost_achieved_flops_per_gpu(double flops_per_iter, double iter_s, int64_t gpus) {
  if (!(iter_s > 0) || gpus <= 0) return 0;
  return flops_per_iter / (iter_s * (double)gpus);
}

double cost_training_time_s(double tokens, double params, int64_t gpus, double flops_per_gpu) {
  if (gpus <= 0 || !(flops_per_gpu > 0)) return NEVER;
  return 8.0 * tokens * params / ((double)gpus * flops_per_gpu);
}

/* ------------------------------------------------------------------ */
/* scaling laws                                                          */

double cost_amdahl_speedup(double f, double n) {
  if (!(n > 0)) return 0;
  return 1.0 / (f + (1.0 - f) / n);
}

double cost_gustafson_speedup(double f, double n) { return n - f * (n - 1.0); }

double cost_karp_flatt(double speedup, double n) {
  if (!(n > 1) || !(speedup > 0)) return 0;
  return (1.0 / speedup - 1.0 / n) / (1.0 - 1.0 / n);
}

/* 1/S = f + (1-f)/n  <=>  1/S - 1/n = f (1 - 1/n): a line through the origin,
 * whose least-squares slope is sum(x y) / sum(x x). */
double cost_amdahl_fit(const double *n, const double *speedup, int count) {
  if (!n || !speedup) return 0;
  double sxy = 0, sxx = 0;
  for (int i = 0; i < count; i++) {
    if (!(n[i] > 1) || !(speedup[i] > 0) || !isfinite(n[i]) || !isfinite(speedup[i])) continue;
    double x = 1.0 - 1.0 / n[i];
    double y = 1.0 / speedup[i] - 1.0 / n[i];
    sxy += x * y;
    sxx += x * x;
  }
  if (!(sxx > 0)) return 0;
  double f = sxy / sxx;
  return f < 0 ? 0 : f > 1 ? 1 : f;
}
