/* catalog.c - the built-in devices and clusters.
 *
 * Every figure below is listed in docs/catalog.md with its source; change
 * both together. Units are SI (bytes, seconds); FLOP/s are dense peaks;
 * bandwidths are one direction of a link. Latencies are not datasheet
 * figures but the per-message start-up cost (the alpha of an alpha-beta
 * model) of a collective over that link, chosen once here so that every
 * estimate uses the same assumption. */
#include "catalog.h"

#include <ctype.h>
#include <stddef.h>
#include <string.h>

#include "diag.h"

#define GiB 1073741824.0 /* 2^30: HBM "GB" on datasheets is binary */
#define GB 1e9           /* bandwidths are decimal */
#define TF 1e12
#define US 1e-6

/* Start-up latency assumptions (see the file comment). NVLink/xGMI through a
 * switch or a direct link costs a couple of microseconds per NCCL/RCCL step;
 * PCIe peer copies a little more; InfiniBand between nodes about 5 us. */
#define LAT_FABRIC (2 * US)
#define LAT_PCIE (3 * US)
#define LAT_IB (5 * US)
#define LAT_SHM (1 * US)

/* Defaults for the `cpu` device until cat_set_cpu() replaces them: an 8-core
 * laptop at ~3 GHz with two 256-bit FMA units per core (8 lanes x 2 FLOP x 2
 * units x 8 cores x 3 GHz = 768 GFLOP/s), dual-channel DRAM of ~50 GB/s and
 * 16 GiB. Deliberately modest: a plan made before measuring should not
 * flatter the machine. */
#define CPU_FP32 (768e9)
#define CPU_MEM_BW (50 * GB)
#define CPU_MEM (16 * GiB)

/* Mutable only so that cat_set_cpu() can fill in the measured `cpu` entry;
 * callers see const pointers. */
static CatDevice devices[] = {
    /* name, aliases, vendor, mem, hbm bw,
     * fp64, fp32, tf32, bf16, fp16, fp8, fp4, link, link latency, source,
     * SMs (0: the planner's table, cost.c; a cluster's `sms` sets them) */
    {"a100-40gb", "a100-sxm4-40gb a100-sxm-40gb", "NVIDIA", 40 * GiB, 1555 * GB,
     19.5 * TF, 19.5 * TF, 156 * TF, 312 * TF, 312 * TF, 0, 0, 300 * GB, LAT_FABRIC,
     "NVIDIA A100 Tensor Core GPU datasheet (2021), SXM4 40GB", 0},
    {"a100-80gb", "a100-sxm4-80gb a100-sxm-80gb a100 a100-sxm", "NVIDIA", 80 * GiB, 2039 * GB,
     19.5 * TF, 19.5 * TF, 156 * TF, 312 * TF, 312 * TF, 0, 0, 300 * GB, LAT_FABRIC,
     "NVIDIA A100 Tensor Core GPU datasheet (2021), SXM4 80GB", 0},
    {"h100-sxm", "h100 h100-sxm5 h100-sxm-80gb h100-sxm5-80gb", "NVIDIA", 80 * GiB, 3350 * GB,
     66.9 * TF, 66.9 * TF, 494.7 * TF, 989.4 * TF, 989.4 * TF, 1978.9 * TF, 0, 450 * GB, LAT_FABRIC,
     "NVIDIA H100 Tensor Core GPU datasheet (2023) and architecture whitepaper (2022), SXM5", 0},
    /* PCIe card: the fabric between cards is PCIe Gen5 x16 (NVLink bridges
     * join pairs only, so a collective over more than two cards runs at
     * PCIe speed). */
    {"h100-pcie", "h100-pcie-80gb", "NVIDIA", 80 * GiB, 2000 * GB,
     51.2 * TF, 51.2 * TF, 378 * TF, 756 * TF, 756 * TF, 1513 * TF, 0, 64 * GB, LAT_PCIE,
     "NVIDIA H100 Tensor Core GPU datasheet (2023) and architecture whitepaper (2022), PCIe", 0},
    /* Same GH100 compute as the H100 SXM; larger, faster HBM3e. */
    {"h200", "h200-sxm h200-141gb h200-sxm-141gb", "NVIDIA", 141 * GiB, 4800 * GB,
     66.9 * TF, 66.9 * TF, 494.7 * TF, 989.4 * TF, 989.4 * TF, 1978.9 * TF, 0, 450 * GB, LAT_FABRIC,
     "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM", 0},
    /* HGX B200 at 1000 W. NVIDIA has quoted 192 GB and later 180 GB per GPU
     * (DGX B200: 1,440 GB for 8); the smaller, shipping figure is used. */
    {"b200", "b200-sxm b200-180gb", "NVIDIA", 180 * GiB, 8000 * GB,
     40 * TF, 80 * TF, 1100 * TF, 2250 * TF, 2250 * TF, 4500 * TF, 9000 * TF, 900 * GB, LAT_FABRIC,
     "NVIDIA HGX B200 / DGX B200 datasheets (2024), 1000 W", 0},
    /* The B200 of a GB200 NVL72 rack (1200 W): the rack's figures divided
     * by its 72 GPUs, sparse rates halved (FP8 720 and BF16 360 PFLOPS
     * sparse, TF32 180, FP64 2880 TFLOPS; 13.4 TB of HBM3e at 576 TB/s;
     * NVLink 130 TB/s, 1.8 TB/s a GPU both ways). FP32 as the B200's. */
    {"gb200", "gb200-nvl72-gpu b200-gb200", "NVIDIA", 186 * GiB, 8000 * GB,
     40 * TF, 80 * TF, 1250 * TF, 2500 * TF, 2500 * TF, 5000 * TF, 10000 * TF, 900 * GB, LAT_FABRIC,
     "NVIDIA GB200 NVL72 specifications (2024), per GPU of 72", 0},
    /* Blackwell Ultra of a GB300 NVL72 rack (1400 W): FP8 and BF16 as
     * GB200's (the rack's 720 / 360 PFLOPS sparse), FP64 cut to the rack's
     * 100 TFLOPS / 72; 279 GB of HBM3e a GPU (20.1 TB / 72) at 8 TB/s. */
    {"gb300", "gb300-nvl72-gpu b300-gb300 blackwell-ultra", "NVIDIA", 279 * GiB, 8000 * GB,
     1.39 * TF, 80 * TF, 1250 * TF, 2500 * TF, 2500 * TF, 5000 * TF, 15000 * TF, 900 * GB, LAT_FABRIC,
     "NVIDIA GB300 NVL72 specifications and 'Inside NVIDIA Blackwell Ultra' (2025), per GPU of 72", 0},
    /* Blackwell Ultra on an HGX B300 board (1100 W): the HGX / DGX B300
     * figures (FP8 72 PFLOPS with sparsity for 8, dense half; FP4 dense
     * about 13 PFLOPS a GPU; FP64 cut to 1.25 TFLOPS), 288 GB of HBM3e a
     * GPU (2.3 TB for 8) at 8 TB/s, NVLink 5. */
    {"b300", "b300-sxm b300-288gb hgx-b300", "NVIDIA", 288 * GiB, 8000 * GB,
     1.25 * TF, 75 * TF, 1125 * TF, 2250 * TF, 2250 * TF, 4500 * TF, 13125 * TF, 900 * GB, LAT_FABRIC,
     "NVIDIA HGX B300 / DGX B300 specifications (2025), 1100 W", 0},
    /* CDNA 3 as the MI300X (the same compute), with 256 GB of HBM3E at
     * 6 TB/s and 1000 W. */
    {"mi325x", "instinct-mi325x", "AMD", 256 * GiB, 6000 * GB,
     163.4 * TF, 163.4 * TF, 653.7 * TF, 1307.4 * TF, 1307.4 * TF, 2614.9 * TF, 0, 448 * GB, LAT_FABRIC,
     "AMD Instinct MI325X data sheet (2024)", 0},
    /* One OAM = two GCDs, which the system shows as two GPUs; the
     * datasheet's figures are for the whole OAM. 8 Infinity Fabric links of
     * 50 GB/s per direction. */
    {"mi250x", "instinct-mi250x mi250x-oam", "AMD", 128 * GiB, 3276.8 * GB,
     95.7 * TF, 95.7 * TF, 0, 383 * TF, 383 * TF, 0, 0, 400 * GB, LAT_FABRIC,
     "AMD Instinct MI250X data sheet (2021); ROCm MI250 microarchitecture guide", 0},
    /* One GCD of an MI250X, the unit a rank runs on: half of the OAM. Its
     * link to a GCD of another OAM is one or two 50 GB/s xGMI links (200 GB/s
     * to its sibling in the same package); a ring sees the slowest hop. */
    {"mi250x-gcd", "", "AMD", 64 * GiB, 1638.4 * GB,
     47.85 * TF, 47.85 * TF, 0, 191.5 * TF, 191.5 * TF, 0, 0, 50 * GB, LAT_FABRIC,
     "derived: half of AMD Instinct MI250X data sheet (2021); ROCm MI250 guide (links)", 0},
    /* 7 Infinity Fabric links to the other 7 GPUs of a platform, 64 GB/s
     * per direction each (128 GB/s bidirectional). */
    {"mi300x", "instinct-mi300x", "AMD", 192 * GiB, 5300 * GB,
     163.4 * TF, 163.4 * TF, 653.7 * TF, 1307.4 * TF, 1307.4 * TF, 2614.9 * TF, 0, 448 * GB,
     LAT_FABRIC, "AMD Instinct MI300X data sheet (2023); ROCm MI300 microarchitecture guide", 0},
    /* Turing: no bf16 or tf32. fp64 runs at 1/32 of fp32 (not on the
     * datasheet; 40 SMs x 2 FP64 units x 2 FLOP x 1.59 GHz). PCIe Gen3 x16. */
    {"t4", "tesla-t4", "NVIDIA", 16 * GiB, 320 * GB,
     0.254 * TF, 8.1 * TF, 0, 0, 65 * TF, 0, 0, 16 * GB, LAT_PCIE,
     "NVIDIA T4 Tensor Core GPU datasheet (2019)", 0},
    /* Per chip. ICI is 1,200 GB/s bidirectional per chip (4,800 Gbps each
     * way) over a 3D torus. No fp32/fp16 matrix rate is published. */
    {"tpu-v5p", "v5p tpuv5p", "Google", 95 * GiB, 2765 * GB,
     0, 0, 0, 459 * TF, 0, 459 * TF, 0, 600 * GB, LAT_FABRIC,
     "Google Cloud TPU v5p documentation (2024)", 0},
    /* Placeholder for this machine; see cat_set_cpu(). Reduced precisions
     * run through fp32 arithmetic in the CPU kernels, so they share its rate;
     * fp64 is half of it (half the SIMD lanes). */
    {"cpu", "host localhost", "generic", CPU_MEM, CPU_MEM_BW,
     CPU_FP32 / 2, CPU_FP32, 0, CPU_FP32, CPU_FP32, 0, 0, CPU_MEM_BW / 2, LAT_SHM,
     "defaults until measured by the CPU microbenchmark", 0},
};

#define N_DEVICES ((int)(sizeof devices / sizeof devices[0]))

/* InfiniBand per port per direction: HDR 200 Gb/s, NDR 400 Gb/s. */
#define HDR (200e9 / 8)
#define NDR (400e9 / 8)

static CatCluster clusters[] = {
    /* name, aliases, device, gpus/node, nics/node, nic bw, inter lat,
     * intra bw, intra lat, source, max nodes, shared device */
    {"dgx-a100-80gb", "dgx-a100 dgx-a100-640gb", "a100-80gb", 8, 8, HDR, LAT_IB, 300 * GB,
     LAT_FABRIC, "NVIDIA DGX A100 datasheet (2021), 640GB system", 0, 0},
    {"dgx-a100-40gb", "dgx-a100-320gb", "a100-40gb", 8, 8, HDR, LAT_IB, 300 * GB, LAT_FABRIC,
     "NVIDIA DGX A100 datasheet (2020), 320GB system", 0, 0},
    {"dgx-h100", "dgx-h100-640gb", "h100-sxm", 8, 8, NDR, LAT_IB, 450 * GB, LAT_FABRIC,
     "NVIDIA DGX H100 datasheet (2023)", 0, 0},
    {"dgx-h200", "dgx-h200-1128gb", "h200", 8, 8, NDR, LAT_IB, 450 * GB, LAT_FABRIC,
     "NVIDIA DGX H200 datasheet (2024)", 0, 0},
    {"dgx-b200", "dgx-b200-1440gb", "b200", 8, 8, NDR, LAT_IB, 900 * GB, LAT_FABRIC,
     "NVIDIA DGX B200 datasheet (2024)", 0, 0},
    /* A GB200 NVL72 rack is one NVLink domain of 72 GPUs (a "node" here:
     * the span of the fast fabric), one ConnectX-7 400 Gb/s NIC a GPU to
     * the InfiniBand fabric between racks. A job on fewer GPUs than a rack
     * stays inside one. */
    {"gb200-nvl72", "dgx-gb200", "gb200", 72, 72, NDR, LAT_IB, 900 * GB, LAT_FABRIC,
     "NVIDIA GB200 NVL72 specifications and DGX GB200 user guide (2024)", 0, 0},
    /* The same rack with Blackwell Ultra and ConnectX-8 SuperNICs of
     * 800 Gb/s, one a GPU. */
    {"gb300-nvl72", "dgx-gb300", "gb300", 72, 72, 800e9 / 8, LAT_IB, 900 * GB, LAT_FABRIC,
     "NVIDIA GB300 NVL72 specifications (2025)", 0, 0},
    /* 8 B300 on NVLink 5 switches, 8 ConnectX-8 SuperNICs of 800 Gb/s. */
    {"dgx-b300", "dgx-b300-2300gb", "b300", 8, 8, 800e9 / 8, LAT_IB, 900 * GB, LAT_FABRIC,
     "NVIDIA DGX B300 specifications (2025)", 0, 0},
    /* 4 MI250X = 8 GCDs per node, one 200 Gb/s Slingshot NIC per OAM. */
    {"frontier", "olcf-frontier", "mi250x-gcd", 8, 4, 200e9 / 8, LAT_IB, 50 * GB, LAT_FABRIC,
     "OLCF Frontier user guide (2023); ROCm MI250 microarchitecture guide", 0, 0},
    /* 8 MI300X fully connected by Infinity Fabric, 8 x 400 Gb/s NDR. */
    {"nd-mi300x-v5", "azure-nd-mi300x-v5 mi300x-node", "mi300x", 8, 8, NDR, LAT_IB, 448 * GB,
     LAT_FABRIC, "Microsoft Azure ND MI300X v5 size documentation (2024)", 0, 0},
    /* One machine whose ranks share the cores and DRAM. Ranks exchange data
     * through shared memory: a copy reads and writes, so half of DRAM
     * bandwidth. cat_set_cpu() updates it. */
    {"cpu", "laptop local localhost", "cpu", 1, 0, 0, 0, CPU_MEM_BW / 2, LAT_SHM,
     "this machine (figures of the cpu device)", 1, 1},
};

#define N_CLUSTERS ((int)(sizeof clusters / sizeof clusters[0]))

/* Catalog spelling: lower case, '_' read as '-'. */
static int norm_char(int c) {
  c = tolower((unsigned char)c);
  return c == '_' ? '-' : c;
}

/* Does the name `a` equal the first `blen` bytes of `b`, ignoring case and
 * '-'/'_'? */
static int name_eq(const char *a, const char *b, size_t blen) {
  size_t i = 0;
  for (; a[i] && i < blen; i++)
    if (norm_char(a[i]) != norm_char(b[i])) return 0;
  return a[i] == '\0' && i == blen;
}

/* Does `name` match `canon` or one of the space-separated `aliases`? */
static int matches(const char *name, const char *canon, const char *aliases) {
  if (name_eq(name, canon, strlen(canon))) return 1;
  for (const char *p = aliases; p && *p;) {
    while (*p == ' ') p++;
    size_t n = strcspn(p, " ");
    if (n && name_eq(name, p, n)) return 1;
    p += n;
  }
  return 0;
}

const CatDevice *cat_device(const char *name) {
  if (!name) return NULL;
  for (int i = 0; i < N_DEVICES; i++)
    if (matches(name, devices[i].name, devices[i].aliases)) return &devices[i];
  return NULL;
}

int cat_device_count(void) { return N_DEVICES; }

const CatDevice *cat_device_at(int i) {
  return i >= 0 && i < N_DEVICES ? &devices[i] : NULL;
}

const CatCluster *cat_cluster(const char *name) {
  if (!name) return NULL;
  for (int i = 0; i < N_CLUSTERS; i++)
    if (matches(name, clusters[i].name, clusters[i].aliases)) return &clusters[i];
  return NULL;
}

int cat_cluster_count(void) { return N_CLUSTERS; }

const CatCluster *cat_cluster_at(int i) {
  return i >= 0 && i < N_CLUSTERS ? &clusters[i] : NULL;
}

/* ---- "did you mean" ----
 * diag_closest() wants an array of strings, so every name and alias is
 * spelled out once into fixed storage; the catalog is small and constant. */

enum { MAX_SPELLINGS = 96, MAX_SPELLING_LEN = 40 };

typedef struct {
  int n;
  char text[MAX_SPELLINGS][MAX_SPELLING_LEN];
  const char *ptr[MAX_SPELLINGS];
  const char *canon[MAX_SPELLINGS];
} Spellings;

static void add_spelling(Spellings *s, const char *p, size_t n, const char *canon) {
  if (s->n >= MAX_SPELLINGS || n == 0 || n >= MAX_SPELLING_LEN) return;
  for (size_t i = 0; i < n; i++) s->text[s->n][i] = (char)norm_char(p[i]);
  s->text[s->n][n] = '\0';
  s->ptr[s->n] = s->text[s->n];
  s->canon[s->n] = canon;
  s->n++;
}

static void add_entry(Spellings *s, const char *canon, const char *aliases) {
  add_spelling(s, canon, strlen(canon), canon);
  for (const char *p = aliases; p && *p;) {
    while (*p == ' ') p++;
    size_t n = strcspn(p, " ");
    add_spelling(s, p, n, canon);
    p += n;
  }
}

static const char *closest(const Spellings *s, const char *name) {
  char key[MAX_SPELLING_LEN * 4];
  size_t n = strlen(name);
  if (n >= sizeof key) return NULL; /* too long to be a typo of any entry */
  for (size_t i = 0; i < n; i++) key[i] = (char)norm_char(name[i]);
  key[n] = '\0';
  const char *hit = diag_closest(key, s->ptr, s->n);
  for (int i = 0; hit && i < s->n; i++)
    if (s->ptr[i] == hit) return s->canon[i];
  return NULL;
}

const char *cat_closest_device(const char *name) {
  static Spellings s;
  if (!name) return NULL;
  if (s.n == 0)
    for (int i = 0; i < N_DEVICES; i++) add_entry(&s, devices[i].name, devices[i].aliases);
  return closest(&s, name);
}

const char *cat_closest_cluster(const char *name) {
  static Spellings s;
  if (!name) return NULL;
  if (s.n == 0)
    for (int i = 0; i < N_CLUSTERS; i++) add_entry(&s, clusters[i].name, clusters[i].aliases);
  return closest(&s, name);
}

/* Where d keeps its peak of `precision` (case-insensitive); NULL for an unknown name. */
static const double *peak_field(const CatDevice *d, const char *precision) {
  static const struct {
    const char *name;
    size_t offset;
  } fields[] = {
      {"fp64", offsetof(CatDevice, peak_flops_fp64)},
      {"fp32", offsetof(CatDevice, peak_flops_fp32)},
      {"tf32", offsetof(CatDevice, peak_flops_tf32)},
      {"bf16", offsetof(CatDevice, peak_flops_bf16)},
      {"fp16", offsetof(CatDevice, peak_flops_fp16)},
      {"fp8", offsetof(CatDevice, peak_flops_fp8)},
      {"fp4", offsetof(CatDevice, peak_flops_fp4)},
  };
  /* the canonical spelling first: a planner search asks about a million times */
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    if (!strcmp(fields[i].name, precision)) return (const double *)((const char *)d + fields[i].offset);
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    if (name_eq(fields[i].name, precision, strlen(precision))) return (const double *)((const char *)d + fields[i].offset);
  return NULL;
}

double cat_peak_flops(const CatDevice *d, const char *precision) {
  if (!d || !precision) return 0;
  const double *f = peak_field(d, precision);
  return f ? *f : 0;
}

int cat_set_peak_flops(CatDevice *d, const char *precision, double flops) {
  if (!d || !precision) return 0;
  double *f = (double *)peak_field(d, precision);
  if (f) *f = flops;
  return f != NULL;
}

void cat_set_cpu(double flops_fp32, double mem_bw, double mem_bytes) {
  CatDevice *d = (CatDevice *)cat_device("cpu");
  CatCluster *c = (CatCluster *)cat_cluster("cpu");
  if (!d || !c || (flops_fp32 <= 0 && mem_bw <= 0 && mem_bytes <= 0)) return;
  if (flops_fp32 > 0) {
    d->peak_flops_fp32 = flops_fp32;
    d->peak_flops_fp64 = flops_fp32 / 2;
    d->peak_flops_bf16 = flops_fp32;
    d->peak_flops_fp16 = flops_fp32;
  }
  if (mem_bw > 0) {
    d->hbm_bytes_per_s = mem_bw;
    d->link_bytes_per_s = mem_bw / 2;
    c->intra_bytes_per_s = mem_bw / 2;
  }
  if (mem_bytes > 0) d->mem_bytes = mem_bytes;
  d->source = "measured by the CPU microbenchmark";
  c->source = "this machine (cpu device measured)";
}

void cat_set_cpu_bf16(double flops_bf16) {
  CatDevice *d = (CatDevice *)cat_device("cpu");
  if (d && flops_bf16 > 0) d->peak_flops_bf16 = flops_bf16;
}
