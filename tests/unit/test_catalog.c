/* test_catalog.c - lookups and figures of the built-in hardware catalog. */
#include "catalog.h"

#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static void test_device_lookup(void) {
  const CatDevice *a = cat_device("a100-80gb");
  EXPECT(a != NULL);
  EXPECT_STR(a ? a->name : NULL, "a100-80gb");
  /* aliases, case and '-' / '_' all lead to the same entry */
  EXPECT(cat_device("a100") == a);
  EXPECT(cat_device("A100-SXM4-80GB") == a);
  EXPECT(cat_device("a100_80gb") == a);
  EXPECT(cat_device("A100_Sxm4_80GB") == a);
  EXPECT(cat_device("a100_40gb") == cat_device("a100-sxm4-40gb"));
  EXPECT(cat_device("a100-40gb") != a);
  EXPECT(cat_device("h100") == cat_device("h100-sxm"));
  EXPECT(cat_device("H100_PCIe") != cat_device("h100"));
  EXPECT(cat_device("tpu_v5p") == cat_device("tpu-v5p"));

  /* partial names and prefixes are not matches */
  EXPECT(cat_device("a100-80") == NULL);
  EXPECT(cat_device("a100-80gbx") == NULL);
  EXPECT(cat_device("") == NULL);
  EXPECT(cat_device(NULL) == NULL);
  EXPECT(cat_device("v100") == NULL);

  const char *required[] = {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "gb200",
                            "gb300", "b300", "mi250x", "mi300x", "mi325x", "t4", "tpu-v5p", "cpu"};
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
    const CatDevice *d = cat_device(required[i]);
    EXPECT(d != NULL);
    if (!d) continue;
    EXPECT(d->mem_bytes > 0 && d->hbm_bytes_per_s > 0 && d->link_bytes_per_s > 0);
    EXPECT(d->source && d->source[0]);
  }
}

static void test_enumeration(void) {
  int n = cat_device_count();
  EXPECT(n >= 11);
  for (int i = 0; i < n; i++) {
    const CatDevice *d = cat_device_at(i);
    EXPECT(d != NULL);
    if (!d) continue;
    /* every entry is found by its own name, and the names are unique */
    EXPECT(cat_device(d->name) == d);
    EXPECT(d->peak_flops_bf16 > 0 || d->peak_flops_fp16 > 0);
  }
  EXPECT(cat_device_at(-1) == NULL);
  EXPECT(cat_device_at(n) == NULL);

  int m = cat_cluster_count();
  EXPECT(m >= 7);
  for (int i = 0; i < m; i++) {
    const CatCluster *c = cat_cluster_at(i);
    EXPECT(c != NULL);
    if (!c) continue;
    EXPECT(cat_cluster(c->name) == c);
    /* every cluster names a device of the catalog */
    EXPECT(cat_device(c->device) != NULL);
    EXPECT(c->gpus_per_node >= 1);
    EXPECT(c->max_nodes == 1 || (c->nics_per_node > 0 && c->nic_bytes_per_s > 0));
  }
  EXPECT(cat_cluster_at(m) == NULL);
}

static void test_device_figures(void) {
  const double tol = 1e-9;
  const CatDevice *a80 = cat_device("a100-80gb");
  const CatDevice *a40 = cat_device("a100-40gb");
  const CatDevice *h = cat_device("h100-sxm");
  if (!a80 || !a40 || !h) {
    EXPECT(!"missing device");
    return;
  }
  EXPECT_NEAR(a80->peak_flops_bf16, 312e12, tol);
  EXPECT_NEAR(a80->peak_flops_fp32, 19.5e12, tol);
  EXPECT_NEAR(a80->peak_flops_tf32, 156e12, tol);
  EXPECT(a80->peak_flops_fp8 == 0); /* Ampere has no fp8 */
  EXPECT_NEAR(a80->hbm_bytes_per_s, 2039e9, tol);
  EXPECT_NEAR(a40->hbm_bytes_per_s, 1555e9, tol);
  EXPECT_NEAR(a80->mem_bytes, 80.0 * 1073741824.0, tol);
  EXPECT_NEAR(a40->mem_bytes, 40.0 * 1073741824.0, tol);
  EXPECT_NEAR(a80->link_bytes_per_s, 300e9, tol); /* 600 GB/s bidirectional */

  EXPECT_NEAR(h->peak_flops_bf16, 989.4e12, tol);
  EXPECT_NEAR(h->peak_flops_fp8, 1978.9e12, tol);
  EXPECT_NEAR(h->peak_flops_fp32, 66.9e12, tol);
  EXPECT_NEAR(h->peak_flops_tf32, 494.7e12, tol);
  EXPECT_NEAR(h->hbm_bytes_per_s, 3.35e12, tol);
  EXPECT_NEAR(h->link_bytes_per_s, 450e9, tol); /* 900 GB/s bidirectional */

  /* H200 = H100 compute with bigger, faster memory */
  const CatDevice *h200 = cat_device("h200");
  EXPECT(h200 && h200->peak_flops_bf16 == h->peak_flops_bf16);
  EXPECT(h200 && h200->mem_bytes > h->mem_bytes && h200->hbm_bytes_per_s > h->hbm_bytes_per_s);

  const CatDevice *mi = cat_device("mi300x");
  EXPECT(mi && fabs(mi->peak_flops_bf16 - 1307.4e12) <= 1e-9 * 1307.4e12);
  const CatDevice *tpu = cat_device("tpu-v5p");
  EXPECT(tpu && fabs(tpu->peak_flops_bf16 - 459e12) <= 1e-9 * 459e12);
  const CatDevice *t4 = cat_device("t4");
  EXPECT(t4 && t4->peak_flops_bf16 == 0 && t4->peak_flops_fp16 > 0);

  /* sanity over the whole table: dense peaks grow as precision shrinks
   * wherever both precisions exist */
  for (int i = 0; i < cat_device_count(); i++) {
    const CatDevice *d = cat_device_at(i);
    if (d->peak_flops_fp8 > 0 && d->peak_flops_bf16 > 0)
      EXPECT(d->peak_flops_fp8 >= d->peak_flops_bf16);
    if (d->peak_flops_tf32 > 0) EXPECT(d->peak_flops_tf32 >= d->peak_flops_fp32);
    if (d->peak_flops_bf16 > 0 && d->peak_flops_fp32 > 0)
      EXPECT(d->peak_flops_bf16 >= d->peak_flops_fp32);
  }
}

static void test_peak_flops(void) {
  const CatDevice *h = cat_device("h100");
  EXPECT_NEAR(cat_peak_flops(h, "bf16"), 989.4e12, 1e-9);
  EXPECT_NEAR(cat_peak_flops(h, "BF16"), 989.4e12, 1e-9);
  EXPECT_NEAR(cat_peak_flops(h, "fp16"), 989.4e12, 1e-9);
  EXPECT_NEAR(cat_peak_flops(h, "fp32"), 66.9e12, 1e-9);
  EXPECT_NEAR(cat_peak_flops(h, "tf32"), 494.7e12, 1e-9);
  EXPECT_NEAR(cat_peak_flops(h, "fp8"), 1978.9e12, 1e-9);
  EXPECT_NEAR(cat_peak_flops(h, "fp64"), 66.9e12, 1e-9);
  EXPECT(cat_peak_flops(h, "int8") == 0);
  EXPECT(cat_peak_flops(h, "fp") == 0);
  EXPECT(cat_peak_flops(h, "") == 0);
  EXPECT(cat_peak_flops(h, NULL) == 0);
  EXPECT(cat_peak_flops(NULL, "bf16") == 0);
  EXPECT(cat_peak_flops(cat_device("a100"), "fp8") == 0);
}

static void test_clusters(void) {
  const CatCluster *a = cat_cluster("dgx-a100-80gb");
  EXPECT(a != NULL);
  if (a) {
    EXPECT_STR(a->device, "a100-80gb");
    EXPECT(a->gpus_per_node == 8 && a->nics_per_node == 8);
    EXPECT_NEAR(a->nic_bytes_per_s, 25e9, 1e-9); /* HDR 200 Gb/s */
    EXPECT_NEAR(a->intra_bytes_per_s, 300e9, 1e-9);
    EXPECT(a->max_nodes == 0 && !a->shared_device);
  }
  EXPECT(cat_cluster("DGX_A100_80GB") == a);
  EXPECT(cat_cluster("dgx-a100") == a);

  const CatCluster *h = cat_cluster("dgx_h100");
  EXPECT(h != NULL);
  if (h) {
    EXPECT_STR(h->device, "h100-sxm");
    EXPECT_NEAR(h->nic_bytes_per_s, 50e9, 1e-9); /* NDR 400 Gb/s */
    EXPECT_NEAR(h->intra_bytes_per_s, 450e9, 1e-9);
  }
  EXPECT(cat_cluster("dgx-a100-40gb") && cat_cluster("dgx-h200") && cat_cluster("dgx-b200"));
  /* the NVL72 racks: one NVLink domain of 72, a NIC a GPU; the GPU's
   * figures are the rack's / 72 (sparse rates halved) */
  const CatCluster *nvl = cat_cluster("dgx-gb200");
  EXPECT(nvl != NULL && nvl == cat_cluster("gb200-nvl72"));
  if (nvl) {
    EXPECT_STR(nvl->device, "gb200");
    EXPECT(nvl->gpus_per_node == 72 && nvl->nics_per_node == 72);
    EXPECT_NEAR(nvl->nic_bytes_per_s, 50e9, 1e-9);
    EXPECT_NEAR(nvl->intra_bytes_per_s, 900e9, 1e-9);
  }
  const CatDevice *gb = cat_device("gb200"), *gu = cat_device("gb300");
  EXPECT(gb && gu);
  if (gb && gu) {
    EXPECT_NEAR(gb->peak_flops_fp8 * 72 * 2, 720e15, 1e-9);
    EXPECT_NEAR(gb->peak_flops_bf16 * 72 * 2, 360e15, 1e-9);
    EXPECT_NEAR(gu->peak_flops_fp8, gb->peak_flops_fp8, 1e-12);
    EXPECT(gu->mem_bytes > gb->mem_bytes);
  }
  EXPECT(cat_cluster("gb300-nvl72") && cat_cluster("gb300-nvl72")->nic_bytes_per_s == 100e9);
  /* DGX B300: Blackwell Ultra at B200's FP8 and BF16 rates, ~1.5x its FP4, 800 Gb/s NICs */
  const CatDevice *b3 = cat_device("hgx-b300"), *b2 = cat_device("b200");
  EXPECT(b3 && b2 && b3 == cat_device("b300"));
  if (b3 && b2) {
    EXPECT_NEAR(b3->peak_flops_fp8, b2->peak_flops_fp8, 1e-12);
    EXPECT(b3->peak_flops_fp4 > 1.4 * b2->peak_flops_fp4 && b3->peak_flops_fp64 < 0.1 * b2->peak_flops_fp64);
  }
  const CatCluster *db3 = cat_cluster("dgx-b300");
  EXPECT(db3 && !strcmp(db3->device, "b300") && db3->nic_bytes_per_s == 100e9);
  /* MI325X: the MI300X's compute, more and faster memory */
  const CatDevice *m3 = cat_device("mi325x"), *m0 = cat_device("mi300x");
  EXPECT(m3 && m0 && m3->peak_flops_bf16 == m0->peak_flops_bf16 && m3->mem_bytes > m0->mem_bytes &&
         m3->hbm_bytes_per_s > m0->hbm_bytes_per_s);

  const CatCluster *lap = cat_cluster("laptop");
  EXPECT(lap != NULL && lap == cat_cluster("cpu"));
  if (lap) {
    EXPECT_STR(lap->device, "cpu");
    EXPECT(lap->max_nodes == 1 && lap->shared_device);
  }
  EXPECT(cat_cluster("dgx") == NULL);
  EXPECT(cat_cluster(NULL) == NULL);
}

static void test_closest(void) {
  EXPECT(cat_device("a100-80bg") == NULL);
  EXPECT_STR(cat_closest_device("a100-80bg"), "a100-80gb");
  EXPECT_STR(cat_closest_device("A100_80G"), "a100-80gb");
  EXPECT_STR(cat_closest_device("h100sxm"), "h100-sxm");
  /* a near miss of an alias suggests the canonical name */
  EXPECT_STR(cat_closest_device("a100-sxm4-80g"), "a100-80gb");
  EXPECT_STR(cat_closest_device("mi300"), "mi300x");
  EXPECT(cat_closest_device("quantum-annealer-9000") == NULL);
  EXPECT(cat_closest_device(NULL) == NULL);

  EXPECT_STR(cat_closest_cluster("dgx-h10"), "dgx-h100");
  EXPECT_STR(cat_closest_cluster("dgx_a100_80g"), "dgx-a100-80gb");
  EXPECT_STR(cat_closest_cluster("laptpo"), "cpu");
  EXPECT(cat_closest_cluster("supercomputer-fugaku") == NULL);

  /* a very long name is no crash and no suggestion */
  char big[4096];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  EXPECT(cat_device(big) == NULL);
  EXPECT(cat_closest_device(big) == NULL);
}

static void test_set_cpu(void) {
  const CatDevice *c = cat_device("cpu");
  const CatCluster *cl = cat_cluster("laptop");
  if (!c || !cl) {
    EXPECT(!"missing cpu entries");
    return;
  }
  double mem_before = c->mem_bytes;
  cat_set_cpu(2e12, 100e9, 0); /* 0: keep the memory size */
  EXPECT_NEAR(c->peak_flops_fp32, 2e12, 1e-12);
  EXPECT_NEAR(cat_peak_flops(c, "bf16"), 2e12, 1e-12);
  EXPECT_NEAR(c->peak_flops_fp64, 1e12, 1e-12);
  EXPECT_NEAR(c->hbm_bytes_per_s, 100e9, 1e-12);
  EXPECT_NEAR(cl->intra_bytes_per_s, 50e9, 1e-12);
  EXPECT(c->mem_bytes == mem_before);
  cat_set_cpu(0, 0, 64e9);
  EXPECT_NEAR(c->mem_bytes, 64e9, 1e-12);
  EXPECT_NEAR(c->peak_flops_fp32, 2e12, 1e-12);
  EXPECT(strstr(c->source, "measured") != NULL);
}

int main(void) {
  test_device_lookup();
  test_enumeration();
  test_device_figures();
  test_peak_flops();
  test_clusters();
  test_closest();
  test_set_cpu();
  TEST_DONE();
}
