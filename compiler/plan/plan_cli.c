/* plan_cli.c - `hpdlc plan`: the layout of the file (its auto fields chosen
 * by the planner), an optional search and scaling study, in one of three
 * formats, and an optional trace (see plan.h). */
#include <errno.h>
#include <jansson.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "cpubench.h"
#include "plan.h"
#include "plan_compare.h"
#include "progress.h"

static int parse_list(const char *s, int64_t *out, int max) {
  int n = 0;
  while (s && *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno || v < 1 || n == max) return -1;
    out[n++] = v;
    s = end;
    if (*s == ',') s++;
    else if (*s) return -1;
  }
  return n;
}

static int plan_command_run(Diag *diag, const char *path, const SemModel *m, const PlanCliOptions *o, const char *format,
                            const int64_t *counts, int ncounts, const PlanCompare *cmp);

int plan_command(Diag *diag, const char *path, const SemModel *m, const PlanCliOptions *o) {
  if (o->calibrate) return plan_calibrate(diag, path, m, o);
  const char *format = o->format ? o->format : "text";
  if (strcmp(format, "text") && strcmp(format, "json") && strcmp(format, "html")) {
    fprintf(stderr, "hpdlc: plan: --format takes text, json or html, not '%s'\n", format);
    return 2;
  }
  int64_t counts[64];
  int ncounts = 0;
  if (o->scaling) {
    ncounts = parse_list(o->scaling, counts, 64);
    if (ncounts < 1) {
      fprintf(stderr, "hpdlc: plan: --scaling takes a list of GPU counts such as 8,16,32, not '%s'\n", o->scaling);
      return 2;
    }
  }
  PlanCompare cmp;
  if (o->compare) {
    if (!strcmp(format, "html")) {
      fprintf(stderr, "hpdlc: plan: --compare prints with --format text or json, not html\n");
      return 2;
    }
    char why[1024];
    if (plan_compare_load(&cmp, o->compare, why, sizeof why) != 0) {
      fprintf(stderr, "hpdlc: plan --compare: %s\n", why);
      return 1;
    }
  }
  int status = plan_command_run(diag, path, m, o, format, counts, ncounts, o->compare ? &cmp : NULL);
  if (o->compare) plan_compare_free(&cmp);
  return status;
}

static int plan_command_run(Diag *diag, const char *path, const SemModel *m, const PlanCliOptions *o, const char *format,
                            const int64_t *counts, int ncounts, const PlanCompare *cmp) {
  if (o->measure_cpu) {
    /* the figures are the cpu device's: a cluster of other devices would
     * be planned as it is, the measurement spent for nothing */
    const char *dev = plan_device_name(m);
    if (strcmp(dev, "cpu")) {
      fprintf(stderr,
              "hpdlc: plan: --measure-cpu measures this machine for the cpu device, but cluster %s has %s devices: plan it with "
              "--cluster cpu, or leave --measure-cpu out\n",
              m->layout.cluster_name ? m->layout.cluster_name : "?", dev);
      return 2;
    }
    CpuFigures f;
    char why[128];
    if (cpubench_measure(&f, why, sizeof why) != 0) {
      fprintf(stderr, "hpdlc: plan: --measure-cpu: %s\n", why);
      return 1;
    }
    cat_set_cpu(f.sgemm_flops, f.triad_bytes_per_s, f.mem_bytes);
    cat_set_cpu_bf16(f.bf16_flops);
    fprintf(stderr, "measured cpu: sgemm %.1f GFLOP/s (%s, %d thread%s), triad %.1f GB/s, %.1f GiB; bf16 GEMM %.1f GFLOP/s (%s)\n",
            f.sgemm_flops / 1e9, f.used_blas ? "OpenBLAS" : "plain C, OpenBLAS not found", f.threads,
            f.threads == 1 ? "" : "s", f.triad_bytes_per_s / 1e9, f.mem_bytes / 1073741824.0, f.bf16_flops / 1e9,
            f.bf16_how);
  }
  PlanCtx *c = plan_new(m, diag);
  if (!c) return 1;
  if (o->materialized) plan_set_attention(c, 0);
  plan_set_attention_kernel(c, o->attention_kernel);
  if (o->fusion_off) plan_set_fusion(c, 0);
  if (o->explain) plan_set_explain(c, 1);
  if (o->evidence) plan_set_evidence_all(c, 1);
  int status = 0;
  PlanLayout L = plan_layout_of(m);
  if (o->search && !o->mb_fixed) L.micro_batch = -1;
  PlanResult plan;
  PlanResult *top = NULL;
  int ntop = 0;
  PlanSearchStats stats = {0};
  memset(&stats, 0, sizeof stats);
  if (o->search) {
    int k = o->top > 0 ? o->top : 5;
    top = calloc((size_t)k, sizeof(PlanResult));
    if (!top) abort();
    Progress *pg = progress_start((ProgressMode)o->progress, stderr, "hpdlc plan --search");
    progress_phase(pg, "pricing every layout on %" PRId64 " GPUs", plan_gpus(c));
    plan_set_progress(c, pg);
    ntop = plan_search(c, &L, k, top, &stats);
    plan_set_progress(c, NULL);
    progress_end(pg);
    /* the plan shown in full is the winner */
    if (ntop > 0) plan_evaluate(c, &top[0].layout, 0, &plan);
    else {
      memset(&plan, 0, sizeof plan);
      /* which of the search's three gates left nothing: the degrees, the
       * model, or the memory */
      plan_search_why_none(c, &L, &stats, plan.why, sizeof plan.why);
      snprintf(plan.limit, sizeof plan.limit, "%s", plan.why);
      plan.layout = L;
      plan.gpus = plan_gpus(c);
    }
  } else {
    plan_resolve(c, &L, &plan);
  }
  if (!plan.valid) {
    status = 1;
    /* A plan that could not be made still reports the model and the cluster
     * it was asked for (its header, JSON model / cluster): the facts no
     * pricing set, from the model itself (unpadded parameters). */
    if (plan.gpus <= 0) plan.gpus = plan_gpus(c);
    if (plan.params <= 0) plan.params = (double)sem_param_count(m);
    if (plan.seq_len <= 0) plan.seq_len = m->seq_len;
    if (plan.global_batch <= 0) plan.global_batch = m->train.global_batch;
  }
  PlanScaling sc;
  memset(&sc, 0, sizeof sc);
  if (ncounts > 0 && plan.valid) plan_scaling(c, &plan.layout, counts, ncounts, &sc);
  /* plan_scaling evaluates other layouts: price the plan again for its stages */
  if (ncounts > 0 && plan.valid) {
    PlanLayout again = plan.layout;
    plan_evaluate(c, &again, 0, &plan);
  }
  FILE *out = stdout;
  if (o->output && strcmp(o->output, "-")) {
    out = fopen(o->output, "w");
    if (!out) {
      fprintf(stderr, "hpdlc: plan: cannot write %s: %s\n", o->output, strerror(errno));
      free(top);
      plan_scaling_free(&sc);
      plan_free(c);
      return 1;
    }
  }
  PlanReport rep = {path, &plan, o->search ? top : NULL, ntop, o->search ? &stats : NULL, ncounts > 0 && plan.valid ? &sc : NULL,
                    NULL};
  if (cmp && plan.valid) rep.compare = plan_compare_json(cmp, c, &plan);
  if (!strcmp(format, "json")) plan_report_json(out, c, &rep);
  else if (!strcmp(format, "html")) plan_report_html(out, c, &rep);
  else {
    plan_report_text(out, c, &rep);
    if (cmp && plan.valid) plan_compare_text(out, cmp, c, &plan);
  }
  if (rep.compare) json_decref((json_t *)rep.compare);
  if (out != stdout) fclose(out);
  if (o->trace && plan.valid) {
    FILE *tf = fopen(o->trace, "w");
    char why[256];
    if (!tf) {
      fprintf(stderr, "hpdlc: error: --trace %s: cannot write it: %s\n", o->trace, strerror(errno));
      status = 1;
    } else {
      int traced = plan_trace(tf, c, &plan.layout, why, sizeof why) == 0;
      fclose(tf);
      if (!traced) {
        fprintf(stderr, "hpdlc: error: --trace %s: no trace written: %s\n", o->trace, why);
        remove(o->trace); /* not an empty file that looks like a trace */
        status = 1;
      }
    }
  }
  free(top);
  plan_scaling_free(&sc);
  plan_free(c);
  return status;
}
