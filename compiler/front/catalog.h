/* catalog.h - the built-in hardware catalog: devices and clusters.
 *
 * The planner prices a program against these figures and the checker resolves
 * `device = ...` and `cluster = "..."` against them. Conventions (see
 * docs/catalog.md, which lists every figure with its source):
 *   - SI units throughout: bytes, seconds, bytes/s, FLOP/s.
 *   - Peak FLOP/s are dense (no 2:4 sparsity) and are the fastest rate a
 *     matrix multiply reaches in that precision (tensor / matrix cores where
 *     the device has them for it); 0 when the device lacks the precision.
 *   - Bandwidths are unidirectional (one direction of a full-duplex link);
 *     datasheets usually quote the bidirectional sum, which is twice this.
 *   - Memory capacity is the physical HBM size; vendors write "80GB" for what
 *     is 80 GiB of HBM, so capacities are stored in 2^30-byte units.
 *
 * Names are matched ignoring case, with '-' and '_' interchangeable, so that
 * `a100_80gb` (an identifier in .hpd) and "A100-80GB" are the same device. */
#ifndef HPDL_CATALOG_H
#define HPDL_CATALOG_H

typedef struct CatDevice {
  const char *name;    /* canonical, lower case, '-' separated */
  const char *aliases; /* space-separated other names; "" when none */
  const char *vendor;
  double mem_bytes;
  double hbm_bytes_per_s;
  /* dense, no sparsity; 0 when unsupported */
  double peak_flops_fp64, peak_flops_fp32, peak_flops_tf32, peak_flops_bf16,
      peak_flops_fp16, peak_flops_fp8;
  double peak_flops_fp4; /* NVFP4 / MXFP4 on Blackwell's tensor cores; 0 elsewhere */
  double link_bytes_per_s; /* per-GPU intra-node fabric bandwidth, unidirectional (e.g. NVLink) */
  double link_latency_s;
  const char *source; /* short citation: datasheet name */
  /* Streaming multiprocessors (compute units) where a cluster declaration
   * gives them (`sms`); 0 in the catalog: the planner's table (cost.c). */
  int sms;
} CatDevice;

typedef struct CatCluster {
  const char *name;
  const char *aliases;
  const char *device; /* canonical name of a CatDevice */
  int gpus_per_node;
  int nics_per_node;
  double nic_bytes_per_s; /* per NIC, unidirectional */
  double inter_latency_s;
  double intra_bytes_per_s; /* per GPU, unidirectional */
  double intra_latency_s;
  const char *source;
  /* Extensions beyond the first draft of this struct: */
  int max_nodes; /* 0 = as many nodes as asked; 1 for a single machine */
  /* 1 when the ranks of a node time-share one device (CPU cores and DRAM):
   * each rank then gets the device's figures divided by the ranks on the
   * node, and gpus_per_node is a default rank count rather than a limit. */
  int shared_device;
} CatCluster;

/* Lookup by name or alias (case-insensitive, '-' == '_'); NULL if unknown. */
const CatDevice *cat_device(const char *name);
int cat_device_count(void);
const CatDevice *cat_device_at(int i); /* NULL when i is out of range */

const CatCluster *cat_cluster(const char *name);
int cat_cluster_count(void);
const CatCluster *cat_cluster_at(int i);

/* The canonical name of the entry whose name or alias is nearest to `name`
 * by edit distance, for "did you mean" hints; NULL when none is close. */
const char *cat_closest_device(const char *name);
const char *cat_closest_cluster(const char *name);

/* Peak dense FLOP/s of `d` in "fp64", "fp32", "tf32", "bf16", "fp16", "fp8" or "fp4"
 * (case-insensitive). 0 when the device lacks the precision or the precision
 * name is unknown, so callers must validate the name themselves. */
double cat_peak_flops(const CatDevice *d, const char *precision);
/* Sets d's peak of `precision` (a device a cluster describes); 0 for an unknown name. */
int cat_set_peak_flops(CatDevice *d, const char *precision, double flops);

/* Fills in the `cpu` device from a microbenchmark of this machine: fp32
 * FLOP/s of all cores, DRAM bandwidth (bytes/s) and DRAM size (bytes). Other
 * precisions follow from fp32 (see docs/catalog.md). Values <= 0 leave the
 * corresponding default unchanged. */
void cat_set_cpu(double flops_fp32, double mem_bw, double mem_bytes);
/* The `cpu` device's bf16 rate: what its bf16 GEMMs measured (oneDNN where
 * installed, core/numeric/gemm16.h); cat_set_cpu sets the fp32 rate there. */
void cat_set_cpu_bf16(double flops_bf16);

#endif
