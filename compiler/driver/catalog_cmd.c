/* catalog_cmd.c - `hpdlc catalog [NAME...] [--format text|json]` (catalog_cmd.h). */
#include "catalog_cmd.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "catalog.h"
#include "cost.h"

static const char *const precisions[] = {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4"};
enum { NPREC = (int)(sizeof precisions / sizeof precisions[0]) };

static const char *family_name(CostGpuGen g) {
  return g == COST_GEN_AMPERE ? "ampere" : g == COST_GEN_HOPPER ? "hopper" : g == COST_GEN_BLACKWELL ? "blackwell" : "other";
}

static void help(void) {
  puts("usage: hpdlc catalog [NAME...] [--format text|json]\n"
       "\n"
       "Lists the devices and clusters hpdlc plan knows, with the figures it prices\n"
       "them by (dense peak FLOP/s, memory, bandwidths a direction; sources in\n"
       "docs/catalog.md). With NAMEs (a device's or cluster's name or alias), shows\n"
       "those entries in full: a device's datasheet figures beside the planner's own\n"
       "(SMs, GEMM ceiling, family), a cluster's links and the cluster block that\n"
       "writes it - a start for a cluster file, which may also describe a device the\n"
       "catalog lacks (memory, memory_bandwidth, sms, fp64 ... fp4).\n"
       "\n"
       "options:\n"
       "  --format text|json  text (the default) or JSON {\"devices\": [...], \"clusters\": [...]}\n"
       "  -h, --help          this help\n"
       "\n"
       "exit status: 0 success, 1 an unknown name, 2 a bad command line.");
}

/* "hpdlc: catalog: WHAT'ARG'TAIL" and the hint; exit status 2 */
static int usage_error(const char *what, const char *arg, const char *tail) {
  fprintf(stderr, "hpdlc: catalog: %s%s%s%s%s\nTry 'hpdlc catalog --help'.\n", what, arg ? "'" : "", arg ? arg : "",
          arg ? "'" : "", tail);
  return 2;
}

/* The `.hpd` spelling of a catalog name: '-' as '_' (an identifier). */
static const char *ident(const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s", name);
  for (char *p = buf; *p; p++)
    if (*p == '-') *p = '_';
  return buf;
}

/* "1978.9" TFLOP/s, "-" for a precision the device lacks */
static const char *tflops(double v, char *buf, size_t n) {
  if (v > 0) snprintf(buf, n, "%.6g", v / 1e12);
  else snprintf(buf, n, "-");
  return buf;
}

static void device_row(const CatDevice *d) {
  char b[4][24], units[16] = "-";
  int sms = cost_device_units(d);
  if (sms > 0) snprintf(units, sizeof units, "%d", sms);
  printf("  %-12s %7.0f %9.0f %7s %7s %7s %7s %9.0f %5s %s\n", d->name, d->mem_bytes / 1073741824.0, d->hbm_bytes_per_s / 1e9,
         tflops(d->peak_flops_fp32, b[0], sizeof b[0]), tflops(d->peak_flops_bf16, b[1], sizeof b[1]),
         tflops(d->peak_flops_fp8, b[2], sizeof b[2]), tflops(d->peak_flops_fp4, b[3], sizeof b[3]), d->link_bytes_per_s / 1e9,
         units, family_name(cost_gpu_generation(d)));
}

static void cluster_row(const CatCluster *c) {
  char nics[32];
  if (c->nics_per_node > 0) snprintf(nics, sizeof nics, "%d x %.0f", c->nics_per_node, c->nic_bytes_per_s * 8 / 1e9);
  else snprintf(nics, sizeof nics, "none");
  printf("  %-15s %-11s %9d %10.0f %12s  %s\n", c->name, c->device, c->gpus_per_node, c->intra_bytes_per_s / 1e9, nics,
         c->max_nodes == 1 ? "1" : "any");
}

static void device_full(const CatDevice *d) {
  char b[24], id[64];
  printf("device %s", d->name);
  if (d->aliases && *d->aliases) printf(" (aliases: %s)", d->aliases);
  printf(", %s\n", d->vendor);
  printf("  memory              %.6g GiB\n", d->mem_bytes / 1073741824.0);
  printf("  memory bandwidth    %.6g GB/s\n", d->hbm_bytes_per_s / 1e9);
  printf("  peak (dense)        ");
  int none = 0;
  for (int k = 0; k < NPREC; k++) {
    double v = cat_peak_flops(d, precisions[k]);
    if (v > 0) printf("%s%s %s", k ? ", " : "", precisions[k], tflops(v, b, sizeof b));
    else none++;
  }
  printf(" TFLOP/s");
  if (none) {
    printf("; none in");
    for (int k = 0, first = 1; k < NPREC; k++)
      if (!(cat_peak_flops(d, precisions[k]) > 0)) printf("%s %s", first ? "" : ",", precisions[k]), first = 0;
  }
  printf("\n  fabric              %.6g GB/s a direction, %.3g us\n", d->link_bytes_per_s / 1e9, d->link_latency_s * 1e6);
  int sms = cost_device_units(d);
  printf("  planner             ");
  if (sms > 0) printf("%d SMs, ", sms);
  printf("GEMM ceiling %.3f of peak, family %s", cost_gemm_ceiling(d), family_name(cost_gpu_generation(d)));
  double sfu = cost_sfu_rate(d);
  if (sfu > 0) printf(", %.3g exponentials/s", sfu);
  printf(" (docs/planner.md 3.2, 3.3, 9.1)\n");
  printf("  source              %s\n", d->source);
  printf("  clusters of it     ");
  int n = 0;
  for (int i = 0; i < cat_cluster_count(); i++) {
    const CatCluster *c = cat_cluster_at(i);
    if (c && !strcmp(c->device, d->name)) printf(" %s", c->name), n++;
  }
  printf("%s\n", n ? "" : " none (a cluster file names it: device = ...)");
  /* a cluster's device figures as a file writes them: a start for a GPU the
   * catalog lacks (edit the ones that differ) */
  printf("  in a cluster file:\n");
  printf("    device = %s\n", ident(d->name, id, sizeof id));
  printf("    memory = %.6gGiB\n", d->mem_bytes / 1073741824.0);
  printf("    memory_bandwidth = %.6gGB/s\n", d->hbm_bytes_per_s / 1e9);
  if (sms > 0) printf("    sms = %d\n", sms);
  for (int k = 0; k < NPREC; k++) {
    double v = cat_peak_flops(d, precisions[k]);
    if (v > 0) printf("    %s = %.6gTFLOP/s\n", precisions[k], v / 1e12);
    else printf("    %s = 0\n", precisions[k]);
  }
}

static void cluster_full(const CatCluster *c) {
  char id[64], dev[64];
  printf("cluster %s", c->name);
  if (c->aliases && *c->aliases) printf(" (aliases: %s)", c->aliases);
  printf("\n  device              %s (hpdlc catalog %s)\n", c->device, c->device);
  printf("  GPUs a node         %d%s\n", c->gpus_per_node, c->shared_device ? " (ranks time-share the device)" : "");
  printf("  inside a node       %.6g GB/s a GPU a direction, %.3g us\n", c->intra_bytes_per_s / 1e9, c->intra_latency_s * 1e6);
  if (c->nics_per_node > 0)
    printf("  between nodes       %d NICs x %.6g GB/s a direction, %.3g us\n", c->nics_per_node, c->nic_bytes_per_s / 1e9,
           c->inter_latency_s * 1e6);
  else printf("  between nodes       no network\n");
  printf("  nodes               %s\n", c->max_nodes == 1 ? "1" : "any");
  printf("  source              %s\n", c->source);
  /* what a cluster file writes to start from this one */
  printf("  as a cluster file:\n");
  printf("    cluster my_%s {\n", ident(c->name, id, sizeof id));
  printf("      device = %s\n", ident(c->device, dev, sizeof dev));
  printf("      gpus_per_node = %d\n", c->gpus_per_node);
  printf("      nics_per_node = %d\n", c->nics_per_node);
  printf("      intra_bandwidth = %.6gGB/s\n", c->intra_bytes_per_s / 1e9);
  printf("      intra_latency = %.3gus\n", c->intra_latency_s * 1e6);
  if (c->nics_per_node > 0) {
    printf("      inter_bandwidth = %.6gGB/s\n", c->nic_bytes_per_s / 1e9);
    printf("      inter_latency = %.3gus\n", c->inter_latency_s * 1e6);
  }
  if (c->shared_device) printf("      shared = true\n");
  printf("    }\n");
}

static json_t *device_json(const CatDevice *d) {
  json_t *o = json_object(), *p = json_object();
  json_object_set_new(o, "name", json_string(d->name));
  json_object_set_new(o, "aliases", json_string(d->aliases ? d->aliases : ""));
  json_object_set_new(o, "vendor", json_string(d->vendor));
  json_object_set_new(o, "memory_bytes", json_real(d->mem_bytes));
  json_object_set_new(o, "memory_bytes_per_s", json_real(d->hbm_bytes_per_s));
  for (int k = 0; k < NPREC; k++) json_object_set_new(p, precisions[k], json_real(cat_peak_flops(d, precisions[k])));
  json_object_set_new(o, "peak_flops", p);
  json_object_set_new(o, "fabric_bytes_per_s", json_real(d->link_bytes_per_s));
  json_object_set_new(o, "fabric_latency_s", json_real(d->link_latency_s));
  json_object_set_new(o, "sms", json_integer(cost_device_units(d)));
  json_object_set_new(o, "gemm_ceiling", json_real(cost_gemm_ceiling(d)));
  json_object_set_new(o, "family", json_string(family_name(cost_gpu_generation(d))));
  json_object_set_new(o, "exponentials_per_s", json_real(cost_sfu_rate(d)));
  json_object_set_new(o, "source", json_string(d->source));
  return o;
}

static json_t *cluster_json(const CatCluster *c) {
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(c->name));
  json_object_set_new(o, "aliases", json_string(c->aliases ? c->aliases : ""));
  json_object_set_new(o, "device", json_string(c->device));
  json_object_set_new(o, "gpus_per_node", json_integer(c->gpus_per_node));
  json_object_set_new(o, "intra_bytes_per_s", json_real(c->intra_bytes_per_s));
  json_object_set_new(o, "intra_latency_s", json_real(c->intra_latency_s));
  json_object_set_new(o, "nics_per_node", json_integer(c->nics_per_node));
  json_object_set_new(o, "nic_bytes_per_s", json_real(c->nic_bytes_per_s));
  json_object_set_new(o, "inter_latency_s", json_real(c->inter_latency_s));
  json_object_set_new(o, "max_nodes", json_integer(c->max_nodes));
  json_object_set_new(o, "shared_device", json_boolean(c->shared_device));
  json_object_set_new(o, "source", json_string(c->source));
  return o;
}

int catalog_main(int argc, char **argv) {
  const char *names[64];
  int nnames = 0, json = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      help();
      return 0;
    } else if (!strcmp(a, "--format") || !strncmp(a, "--format=", 9)) {
      const char *v = a[8] == '=' ? a + 9 : i + 1 < argc ? argv[++i] : NULL;
      if (!v) return usage_error("--format needs a value: text or json", NULL, "");
      if (strcmp(v, "text") && strcmp(v, "json")) return usage_error("--format takes text or json, not ", v, "");
      json = !strcmp(v, "json");
    } else if (a[0] == '-' && a[1]) {
      return usage_error("unknown option ", a, "");
    } else if (nnames == (int)(sizeof names / sizeof names[0])) {
      return usage_error("at most 64 names", NULL, "");
    } else {
      names[nnames++] = a;
    }
  }
  /* every name resolved before anything is printed */
  const CatDevice *devs[64];
  const CatCluster *clus[64];
  int bad = 0;
  for (int i = 0; i < nnames; i++) {
    devs[i] = cat_device(names[i]);
    clus[i] = cat_cluster(names[i]);
    if (devs[i] || clus[i]) continue;
    const char *d = cat_closest_device(names[i]), *c = cat_closest_cluster(names[i]);
    fprintf(stderr, "hpdlc: catalog: no device or cluster is named '%s'", names[i]);
    if (d || c) fprintf(stderr, "; did you mean %s%s%s?", d ? d : "", d && c ? " or " : "", c ? c : "");
    fprintf(stderr, "\n");
    bad = 1;
  }
  if (bad) {
    fprintf(stderr, "hpdlc catalog lists every name\n");
    return 1;
  }
  if (json) {
    json_t *root = json_object(), *da = json_array(), *ca = json_array();
    for (int i = 0; i < (nnames ? nnames : cat_device_count()); i++) {
      const CatDevice *d = nnames ? devs[i] : cat_device_at(i);
      if (d) json_array_append_new(da, device_json(d));
    }
    for (int i = 0; i < (nnames ? nnames : cat_cluster_count()); i++) {
      const CatCluster *c = nnames ? clus[i] : cat_cluster_at(i);
      if (c) json_array_append_new(ca, cluster_json(c));
    }
    json_object_set_new(root, "devices", da);
    json_object_set_new(root, "clusters", ca);
    int rc = json_dumpf(root, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(root);
    printf("\n");
    return rc ? 1 : 0;
  }
  if (nnames) {
    for (int i = 0; i < nnames; i++) {
      if (i) printf("\n");
      if (devs[i]) device_full(devs[i]);
      if (devs[i] && clus[i]) printf("\n");
      if (clus[i]) cluster_full(clus[i]);
    }
    return 0;
  }
  printf("devices: peak TFLOP/s (dense), memory GiB, bandwidths GB/s a direction (docs/catalog.md)\n");
  printf("  %-12s %7s %9s %7s %7s %7s %7s %9s %5s %s\n", "name", "memory", "HBM", "fp32", "bf16", "fp8", "fp4", "fabric", "SMs",
         "family");
  for (int i = 0; i < cat_device_count(); i++) device_row(cat_device_at(i));
  printf("\nclusters: GB/s a GPU inside a node, Gb/s a NIC between nodes\n");
  printf("  %-15s %-11s %9s %10s %12s  %s\n", "name", "device", "GPUs/node", "intra", "NICs x Gb/s", "nodes");
  for (int i = 0; i < cat_cluster_count(); i++) cluster_row(cat_cluster_at(i));
  printf("\nhpdlc catalog NAME shows an entry in full; a cluster file describes any other machine,\n"
         "a device the catalog lacks included (docs/catalog.md).\n");
  return 0;
}
