/* fidelity.c - the planner against published training runs.
 *
 *   test_plan_fidelity HPDLC SOURCE_DIR FIGURES.json
 *
 * For every run of FIGURES.json (Narayanan et al. 2021, Tables 1 and 2,
 * copied with their sources into tests/plan/published_figures.json) runs
 *   hpdlc plan samples/gpt.hpd -D layers=.. -D hidden=.. -D heads=.. --tp ..
 *         --pp .. --dp .. --gpus .. --micro-batch .. --global-batch ..
 *         --cluster dgx-a100-80gb --recompute full --attention materialized
 *         [--schedule interleaved --virtual-stages v] --zero z
 *         --compression fp16 --format json
 * (Megatron-LM 2021 stored the attention scores: no flash attention; its
 * fp16 runs reduced their fp16 gradients as they were, without
 * --accumulate-allreduce-grads-in-fp32, which bf16 runs later forced)
 * and compares throughput.tflops_per_gpu (Narayanan Eq. 3 FLOPs over step
 * time and GPUs, the paper's convention) with the published figure: within
 * the file's tolerance (15%) on every asserted run (Table 1, Table 2's
 * PTD-P rows); Table 2's ZeRO-3 rows are printed, not asserted
 * (docs/planner.md sec. 16 says why). Then the ZeRO paper's model states of
 * a 7.5B model at dp = 64 for stages 0-3, per parameter, within 2%.
 * Prints the table either way.
 *
 *   test_plan_fidelity --set HPDLC SOURCE_DIR FILE.json [--markdown]
 *
 * checks a set file of published step times instead (check_set below:
 * tests/plan/published_h100.json, MosaicML's MPT runs and NeMo 24.07's FP8
 * runs on H100; tests/plan/published_moe.json, Megatron-Core's Mixtral 8x7B
 * with expert parallelism). A run's layout names its flags (set_command),
 * among them the attention kernel its software ran (--attention).
 *
 *   test_plan_fidelity --kernels HPDLC SOURCE_DIR FILE.json RUN
 *
 * prices one run under each attention kernel (check_kernels below).
 *
 *   test_plan_fidelity --evidence HPDLC SOURCE_DIR [--write FILE.inc]
 *
 * plans every published run of tests/plan and writes the planner's evidence
 * table (compiler/plan/plan_evidence_rows.inc), or checks the one compiled
 * in against them (check_evidence below). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>

#include "catalog.h"
#include "cost.h" /* the attention kernels' published rates */
#include "plan_evidence.h"

static json_t *run_plan(const char *cmd) {
  if (getenv("HPDL_FIDELITY_TRACE")) fprintf(stderr, "+ %s\n", cmd); /* to rerun one row by hand */
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  size_t n;
  while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += n;
    if (len + 1 == cap) {
      cap *= 2;
      buf = realloc(buf, cap);
    }
  }
  int rc = pclose(p);
  if (!buf) return NULL;
  buf[len] = 0;
  json_error_t err;
  json_t *j = rc == 0 ? json_loads(buf, 0, &err) : NULL;
  if (!j) fprintf(stderr, "fidelity: no JSON from: %s\n", cmd);
  free(buf);
  return j;
}

static double jget(json_t *root, const char *a, const char *b) {
  json_t *o = json_object_get(root, a);
  json_t *v = o ? json_object_get(o, b) : NULL;
  return v ? json_number_value(v) : NAN;
}

static long jint(json_t *o, const char *k) { return (long)json_integer_value(json_object_get(o, k)); }

/* The keys product.md promises, with their JSON types. */
static int check_schema(const char *hpdlc, const char *src) {
  static const struct {
    const char *a, *b;
    int type;
  } keys[] = {{"model", "params", JSON_REAL},
              {"model", "flops_per_step", JSON_REAL},
              {"parallel", "dp", JSON_INTEGER},
              {"parallel", "tp", JSON_INTEGER},
              {"parallel", "pp", JSON_INTEGER},
              {"parallel", "cp", JSON_INTEGER},
              {"parallel", "zero", JSON_INTEGER},
              {"parallel", "micro_batch", JSON_INTEGER},
              {"parallel", "num_micro_batches", JSON_INTEGER},
              {"parallel", "schedule", JSON_STRING},
              {"parallel", "recompute", JSON_STRING},
              {"memory_per_gpu", "params", JSON_REAL},
              {"memory_per_gpu", "grads", JSON_REAL},
              {"memory_per_gpu", "optimizer", JSON_REAL},
              {"memory_per_gpu", "activations", JSON_REAL},
              {"memory_per_gpu", "total", JSON_REAL},
              {"memory_per_gpu", "capacity", JSON_REAL},
              {"memory_per_gpu", "fits", JSON_TRUE},
              {"comm_per_step", "dp", JSON_REAL},
              {"comm_per_step", "tp", JSON_REAL},
              {"comm_per_step", "pp", JSON_REAL},
              {"comm_per_step", "cp", JSON_REAL},
              {"time", "step_s", JSON_REAL},
              {"time", "compute_s", JSON_REAL},
              {"time", "comm_exposed_s", JSON_REAL},
              {"time", "bubble_fraction", JSON_REAL},
              {"throughput", "tokens_per_s", JSON_REAL},
              {"throughput", "tflops_per_gpu", JSON_REAL},
              {"throughput", "mfu", JSON_REAL}};
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' plan '%s/samples/gpt2.hpd' --format json", hpdlc, src);
  json_t *j = run_plan(cmd);
  if (!j) return 1;
  int bad = 0;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    json_t *o = json_object_get(j, keys[i].a);
    json_t *v = o ? json_object_get(o, keys[i].b) : NULL;
    int t = v ? (int)json_typeof(v) : -1;
    int ok = v && (t == keys[i].type || (keys[i].type == (int)JSON_TRUE && t == (int)JSON_FALSE));
    if (!ok) {
      fprintf(stderr, "schema: %s.%s missing or of the wrong type\n", keys[i].a, keys[i].b);
      bad++;
    }
  }
  if (!json_is_string(json_object_get(j, "schema")) || strcmp(json_string_value(json_object_get(j, "schema")), "hpdl.plan/1")) {
    fprintf(stderr, "schema: \"schema\" is not \"hpdl.plan/1\"\n");
    bad++;
  }
  json_decref(j);
  printf("%s\n", bad ? "schema: FAIL" : "schema: every documented key present");
  return bad ? 1 : 0;
}

/* ---- sets of published step times (tests/plan/published_h100.json) ---- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median_of(double *v, int n) {
  if (n <= 0) return NAN;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Appends " --flag value" for a string or integer member of o. */
static void add_flag(char *cmd, size_t cap, const char *flag, json_t *v) {
  size_t n = strlen(cmd);
  if (json_is_string(v)) snprintf(cmd + n, cap - n, " %s %s", flag, json_string_value(v));
  else if (json_is_integer(v)) snprintf(cmd + n, cap - n, " %s %lld", flag, (long long)json_integer_value(v));
}

/* The hpdlc plan command of one run of a step-time set. */
static void set_command(char *cmd, size_t cap, const char *hpdlc, const char *src, json_t *r) {
  json_t *m = json_object_get(r, "model"), *l = json_object_get(r, "layout");
  snprintf(cmd, cap, "'%s' plan '%s/%s'", hpdlc, src, json_string_value(json_object_get(m, "sample")));
  const char *k;
  json_t *v;
  json_object_foreach(json_object_get(m, "defines"), k, v) {
    size_t n = strlen(cmd);
    if (json_is_real(v)) snprintf(cmd + n, cap - n, " -D %s=%.17g", k, json_real_value(v));
    else snprintf(cmd + n, cap - n, " -D %s=%lld", k, (long long)json_integer_value(v));
  }
  static const char *const keys[][2] = {{"gpus", "--gpus"},         {"tp", "--tp"},
                                        {"pp", "--pp"},             {"cp", "--cp"},
                                        {"dp", "--dp"},             {"zero", "--zero"},
                                        {"micro_batch", "--micro-batch"}, {"global_batch", "--global-batch"},
                                        {"recompute", "--recompute"}, {"sp", "--sp"},
                                        {"precision", "--precision"}, {"cluster", "--cluster"},
                                        {"tp_overlap", "--tp-overlap"}, {"ep", "--ep"}, {"etp", "--etp"},
                                        {"attention", "--attention"}, {"recompute_layers", "--recompute-layers"},
                                        {"compression", "--compression"}, {"moments", "--moments"},
                                        {"dispatcher", "--dispatcher"}, {"fusion", "--fusion"},
                                        {"cp_comm", "--cp-comm"},
                                        {"engine", "--engine"}, {"overlap", "--overlap"},
                                        {"fp8_scaling", "--fp8-scaling"}};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    json_t *val = json_object_get(l, keys[i][0]);
    const char *str = json_string_value(val);
    size_t len = str ? strlen(str) : 0;
    if (!strcmp(keys[i][0], "cluster") && len > 4 && !strcmp(str + len - 4, ".hpd")) {
      size_t n = strlen(cmd); /* a cluster file of the set, relative to the source tree */
      snprintf(cmd + n, cap - n, " --cluster '%s/%s'", src, str);
    } else
      add_flag(cmd, cap, keys[i][1], val);
  }
  long v_ = jint(l, "virtual_stages");
  size_t n = strlen(cmd);
  /* the layers split equally over the stages unless the run says otherwise */
  const char *bal = json_string_value(json_object_get(l, "balance"));
  if (!bal) bal = "layers";
  if (v_ > 1) snprintf(cmd + n, cap - n, " --schedule interleaved --virtual-stages %ld --balance %s", v_, bal);
  else snprintf(cmd + n, cap - n, " --schedule 1f1b --balance %s", bal);
  n = strlen(cmd);
  snprintf(cmd + n, cap - n, " --format json");
}

/* test_plan_fidelity --set HPDLC SOURCE_DIR FILE.json [--markdown]:
 * every run's predicted step time (time.step_s) against the published one;
 * each asserted run within tolerance.step_time_relative, and the median of
 * the absolute errors of each set with asserted runs (over all its runs)
 * under tolerance.median_relative; a set without is printed only. Every
 * run, asserted or not, must get a plan (a layout the planner refuses
 * fails). With --markdown, prints the table of docs/planner.md sec. 16 instead. */
static int check_set(const char *hpdlc, const char *src, const char *file, int markdown) {
  json_error_t err;
  json_t *fig = json_load_file(file, 0, &err);
  if (!fig) {
    fprintf(stderr, "fidelity: %s:%d: %s\n", file, err.line, err.text);
    return 2;
  }
  double tol = json_number_value(json_object_get(json_object_get(fig, "tolerance"), "step_time_relative"));
  double mtol = json_number_value(json_object_get(json_object_get(fig, "tolerance"), "median_relative"));
  json_t *runs = json_object_get(fig, "runs");
  size_t nr = json_array_size(runs);
  for (size_t i = 0; i < nr; i++) { /* a file of another shape (e.g. published_figures.json) */
    if (!json_is_string(json_object_get(json_array_get(runs, i), "set"))) {
      fprintf(stderr, "fidelity: %s: run %zu has no \"set\": not a set file (--set reads published_h100.json's shape)\n",
              file, i);
      json_decref(fig);
      return 2;
    }
  }
  double *errs = calloc(nr + 1, sizeof(double));
  int failures = 0;
  if (markdown) {
    printf("| run | GPUs | layout | published step | predicted | error |\n|---|---|---|---|---|---|\n");
  } else {
    printf("%-40s %5s %10s %10s %8s\n", "run", "GPUs", "pub (s)", "pred (s)", "error");
  }
  json_t *sets = json_object_get(fig, "sources");
  const char *sname;
  json_t *sv;
  json_object_foreach(sets, sname, sv) {
    /* a set with asserted runs has its median asserted, and its other runs marked */
    int ne = 0, asserted_set = 0;
    size_t i;
    json_t *r;
    json_array_foreach(runs, i, r) {
      if (!strcmp(json_string_value(json_object_get(r, "set")), sname) && json_is_true(json_object_get(r, "asserted")))
        asserted_set = 1;
    }
    json_array_foreach(runs, i, r) {
      if (strcmp(json_string_value(json_object_get(r, "set")), sname)) continue;
      char cmd[4096];
      set_command(cmd, sizeof cmd, hpdlc, src, r);
      json_t *out = run_plan(cmd);
      double pub = json_number_value(json_object_get(json_object_get(r, "published"), "step_s"));
      double pred = out ? jget(out, "time", "step_s") : NAN;
      double e = pred / pub - 1;
      int asserted = json_is_true(json_object_get(r, "asserted"));
      int ok = isfinite(e) && fabs(e) <= tol;
      if (asserted && !ok) failures++;
      if (!out) failures++; /* every run, asserted or not, must get a plan */
      errs[ne++] = isfinite(e) ? fabs(e) : INFINITY;
      json_t *l = json_object_get(r, "layout");
      const char *attn = json_string_value(json_object_get(l, "attention"));
      const char *fusion = json_string_value(json_object_get(l, "fusion"));
      int eager = fusion && !strcmp(fusion, "off");
      const char *cpc = json_string_value(json_object_get(l, "cp_comm"));
      int ring = cpc && !strcmp(cpc, "ring") && jint(l, "cp") > 1;
      if (markdown) {
        const char *rc = json_string_value(json_object_get(l, "recompute"));
        char rcs[80] = "";
        if (rc && strcmp(rc, "none")) snprintf(rcs, sizeof rcs, !strcmp(rc, "full") ? ", full recompute" : ", recompute %s", rc);
        if (rc && strcmp(rc, "none") && jint(l, "recompute_layers") > 0) { /* the first N layers of each chunk */
          size_t n = strlen(rcs);
          snprintf(rcs + n, sizeof rcs - n, " of %ld layers", jint(l, "recompute_layers"));
        }
        char eps[48] = ""; /* expert parallelism, folded over the tensor group or not */
        const char *disp = json_string_value(json_object_get(l, "dispatcher"));
        if (jint(l, "ep") > 1)
          snprintf(eps, sizeof eps, " ep %ld%s%s%s", jint(l, "ep"), jint(l, "etp") == 1 ? " etp 1" : "",
                   disp && strcmp(disp, "alltoall") ? " dispatcher " : "", disp && strcmp(disp, "alltoall") ? disp : "");
        printf("| %s%s | %ld | tp %ld pp %ld cp %ld dp %ld%s%s, mb %ld, %s%s%s%s%s%s | %.3f s | %.3f s | %+.1f%% |\n",
               json_string_value(json_object_get(r, "id")), asserted_set && !asserted ? " (not asserted)" : "",
               jint(l, "gpus"), jint(l, "tp"), jint(l, "pp"), jint(l, "cp"),
               jint(l, "dp"), eps, jint(l, "zero") == 3 ? " zero 3" : "", jint(l, "micro_batch"),
               json_string_value(json_object_get(l, "precision")),
               rcs, attn ? ", attention " : "", attn ? attn : "", eager ? ", fusion off" : "", ring ? ", cp_comm ring" : "", pub, pred, e * 100);
      } else {
        printf("%-40s %5ld %10.3f %10.3f %+7.1f%%  %s\n", json_string_value(json_object_get(r, "id")), jint(l, "gpus"), pub,
               pred, e * 100, !asserted ? "(not asserted)" : ok ? "ok" : "FAIL");
        if (!out) fprintf(stderr, "  %s\n", cmd);
      }
      json_decref(out);
    }
    if (!ne) continue;
    double med = median_of(errs, ne);
    int mok = med < mtol;
    if (!mok && asserted_set) failures++;
    if (markdown)
      printf("| **%s: median absolute error%s** | | | | | **%.1f%%** |\n", sname, asserted_set ? "" : " (not asserted)",
             med * 100);
    else
      printf("set %s: %d runs, median absolute error %.1f%% (limit %.0f%%)  %s\n", sname, ne, med * 100, mtol * 100,
             !asserted_set ? "(not asserted)" : mok ? "ok" : "FAIL");
  }
  free(errs);
  json_decref(fig);
  if (failures && !markdown) fprintf(stderr, "%d fidelity check(s) failed\n", failures);
  return failures && !markdown ? 1 : 0;
}

/* The hpdlc plan command of one run of published_figures.json (Narayanan et
 * al. 2021: Megatron-LM's program of 2021, main's comment says how). */
static void figures_command(char *cmd, size_t cap, const char *hpdlc, const char *src, json_t *r) {
  json_t *m = json_object_get(r, "model"), *l = json_object_get(r, "layout");
  long v = jint(l, "virtual_stages");
  char sched[64];
  if (v > 1) snprintf(sched, sizeof sched, "--schedule interleaved --virtual-stages %ld", v);
  else snprintf(sched, sizeof sched, "--schedule 1f1b");
  snprintf(cmd, cap,
           "'%s' plan '%s/samples/gpt.hpd' -D layers=%ld -D hidden=%ld -D heads=%ld -D seq=%ld -D vocab=%ld"
           " --tp %ld --pp %ld --dp %ld --gpus %ld --micro-batch %ld --global-batch %ld --zero %ld"
           " --cluster dgx-a100-80gb --recompute full --balance layers --attention materialized %s"
           " --compression fp16 --format json",
           hpdlc, src, jint(m, "layers"), jint(m, "hidden"), jint(m, "heads"), jint(m, "seq"), jint(m, "vocab"),
           jint(l, "tp"), jint(l, "pp"), jint(l, "dp"), jint(l, "gpus"), jint(l, "micro_batch"),
           jint(l, "global_batch"), jint(l, "zero"), sched);
}

/* ---- the evidence compiled into the planner (plan_evidence.h) ---- */

/* A plan report's traits (its "accuracy": {"traits": ...}) as PlanTraits; -1 when absent. */
static int read_traits(json_t *plan, PlanTraits *t) {
  json_t *tr = json_object_get(json_object_get(plan, "accuracy"), "traits");
  if (!json_is_object(tr)) return -1;
  memset(t, 0, sizeof *t);
  for (int k = 0; k < PLAN_TRAIT_COUNT; k++) {
    json_t *v = json_object_get(tr, plan_trait_key(k));
    if (!v) return -1;
    if (plan_trait_code(k, 0)) { /* a named value: the generation, the GEMM format */
      int found = -1;
      for (int i = 0; plan_trait_code(k, i); i++)
        if (json_is_string(v) && !strcmp(json_string_value(v), plan_trait_code(k, i))) found = i;
      if (found < 0) return -1;
      t->v[k] = found;
    } else
      t->v[k] = json_is_true(v);
  }
  return 0;
}

typedef struct EvRow {
  char id[128], set[96];
  PlanTraits t;
  long gpus, seq;
  double params, error;
  int fitted;
} EvRow;

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every run of SOURCE_DIR/tests/plan/published_*.json, planned: its traits
 * and the planner's error. Returns the count (rows malloc'd), -1 on a run
 * without a plan. */
static int evidence_runs(const char *hpdlc, const char *src, EvRow **out) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/tests/plan", src);
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "fidelity: %s: cannot open\n", dir);
    return -1;
  }
  char *names[64];
  int nf = 0;
  struct dirent *de;
  while ((de = readdir(d)) && nf < 64) {
    size_t len = strlen(de->d_name);
    if (!strncmp(de->d_name, "published_", 10) && len > 5 && !strcmp(de->d_name + len - 5, ".json"))
      names[nf++] = strdup(de->d_name);
  }
  closedir(d);
  qsort(names, (size_t)nf, sizeof *names, cmp_name);
  int n = 0, cap = 64, bad = 0;
  EvRow *rows = calloc((size_t)cap, sizeof *rows);
  for (int f = 0; f < nf; f++) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, names[f]);
    json_error_t err;
    json_t *fig = json_load_file(path, 0, &err);
    if (!fig) {
      fprintf(stderr, "fidelity: %s:%d: %s\n", path, err.line, err.text);
      bad++;
      continue;
    }
    int figures = !strcmp(names[f], "published_figures.json"); /* TFLOP/s, not step times */
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(fig, "runs"), i, r) {
      char cmd[4096];
      if (figures) figures_command(cmd, sizeof cmd, hpdlc, src, r);
      else set_command(cmd, sizeof cmd, hpdlc, src, r);
      json_t *plan = run_plan(cmd);
      EvRow *e;
      if (n == cap) rows = realloc(rows, sizeof *rows * (size_t)(cap *= 2));
      e = &rows[n];
      memset(e, 0, sizeof *e);
      snprintf(e->id, sizeof e->id, "%s", json_string_value(json_object_get(r, "id")));
      snprintf(e->set, sizeof e->set, "%s", figures ? "narayanan21_a100" : json_string_value(json_object_get(r, "set")));
      if (!plan || read_traits(plan, &e->t) < 0) {
        fprintf(stderr, "fidelity: %s: no plan with traits: %s\n", e->id, cmd);
        json_decref(plan);
        bad++;
        continue;
      }
      e->gpus = jint(json_object_get(r, "layout"), "gpus");
      e->params = jget(plan, "model", "params");
      e->seq = (long)jget(plan, "model", "seq_len");
      if (figures) /* the step time's error from throughput's: step = FLOPs / TFLOP/s */
        e->error = json_number_value(json_object_get(r, "published_tflops_per_gpu")) / jget(plan, "throughput", "tflops_per_gpu") - 1;
      else
        e->error = jget(plan, "time", "step_s") / json_number_value(json_object_get(json_object_get(r, "published"), "step_s")) - 1;
      e->fitted = json_is_true(json_object_get(r, "asserted"));
      json_decref(plan);
      if (isfinite(e->error)) n++;
      else {
        fprintf(stderr, "fidelity: %s: no error (no step time)\n", e->id);
        bad++;
      }
    }
    json_decref(fig);
  }
  for (int f = 0; f < nf; f++) free(names[f]);
  *out = rows;
  return bad ? -1 : n;
}

/* test_plan_fidelity --evidence HPDLC SOURCE_DIR [--write FILE.inc]: plans
 * every published run and writes the rows of plan_evidence_rows.inc, or
 * (without --write) checks the rows compiled into this build against them:
 * the same runs, traits and GPUs, each error within 0.05 points. */
static int check_evidence(const char *hpdlc, const char *src, const char *write) {
  EvRow *rows = NULL;
  int n = evidence_runs(hpdlc, src, &rows);
  if (n < 0) {
    free(rows);
    return 2;
  }
  if (write) {
    FILE *f = fopen(write, "w");
    if (!f) {
      fprintf(stderr, "fidelity: %s: cannot write\n", write);
      free(rows);
      return 2;
    }
    fprintf(f, "/* generated by tests/plan/fidelity_table.sh (test_plan_fidelity --evidence --write); do not edit by hand:\n"
               " * every published run of tests/plan, its traits (plan_evidence.h), GPUs, parameters, sequence, the planner's\n"
               " * error (predicted / published step time - 1) and whether it is an asserted run (fitted on) */\n");
    for (int i = 0; i < n; i++) {
      const EvRow *e = &rows[i];
      fprintf(f, "{\"%s\", \"%s\", {{", e->id, e->set);
      for (int k = 0; k < PLAN_TRAIT_COUNT; k++) fprintf(f, "%s%d", k ? ", " : "", e->t.v[k]);
      fprintf(f, "}}, %ld, %.4g, %ld, %.4f, %d},\n", e->gpus, e->params, e->seq, e->error, e->fitted);
    }
    fclose(f);
    printf("evidence: %d runs written to %s\n", n, write);
    free(rows);
    return 0;
  }
  int nb, bad = 0;
  const PlanEvidenceRow *built = plan_evidence_rows(&nb);
  if (nb != n) {
    fprintf(stderr, "evidence: %d runs compiled in, %d published runs planned\n", nb, n);
    bad++;
  }
  for (int i = 0; i < n; i++) {
    const EvRow *e = &rows[i];
    const PlanEvidenceRow *b = NULL;
    for (int j = 0; j < nb; j++)
      if (!strcmp(built[j].id, e->id)) b = &built[j];
    if (!b) {
      fprintf(stderr, "evidence: %s: not compiled in\n", e->id);
      bad++;
      continue;
    }
    int same = b->gpus == e->gpus && b->seq == e->seq && fabs(b->error - e->error) <= 5e-4 && b->fitted == e->fitted;
    for (int k = 0; k < PLAN_TRAIT_COUNT; k++) same &= b->traits.v[k] == e->t.v[k];
    if (!same) {
      fprintf(stderr, "evidence: %s: compiled in %+.2f%% (%d GPUs), planned now %+.2f%% (%ld GPUs), or its traits differ\n",
              e->id, b->error * 100, b->gpus, e->error * 100, e->gpus);
      bad++;
    }
  }
  printf("evidence: %d published runs planned, %d compiled in: %s\n", n, nb, bad ? "STALE" : "the same");
  if (bad) fprintf(stderr, "the planner's evidence is stale: run bash tests/plan/fidelity_table.sh and rebuild\n");
  free(rows);
  return bad ? 1 : 0;
}

/* ---- attention kernels (docs/planner.md sec. 9.1) ---- */

/* The time of the attention of run r (a causal GPT of samples/gpt.hpd, one
 * GPU's share of a data-parallel step) if every kernel ran at the published
 * share of the peak of kernel k: its computed FLOPs (the causal share of
 * blocks of COST_GEMM_TILE rows) forward, again for full recomputation,
 * and 2.5x for the backward (the FlashAttention papers' count). The device
 * and its peak come from the plan's own report (plan: its "cluster"), so a
 * run on a cluster file (compute_scale) is measured on that cluster's peak;
 * attention computes in bf16 under fp8 (docs/planner.md 9.3). NAN when the
 * report names no catalog device. */
static double attention_floor_s(json_t *r, json_t *plan, CostAttnKernel k) {
  json_t *d = json_object_get(json_object_get(r, "model"), "defines"), *l = json_object_get(r, "layout");
  json_t *cl = json_object_get(plan, "cluster");
  const CatDevice *dev = cat_device(json_string_value(json_object_get(cl, "device")));
  const char *prec = json_string_value(json_object_get(l, "precision"));
  if (!prec) prec = "bf16";
  if (!dev || !(cat_peak_flops(dev, prec) > 0)) return NAN;
  /* the cluster's compute_scale: its reported peak over the device's */
  double scale = json_number_value(json_object_get(cl, "peak_flops")) / cat_peak_flops(dev, prec);
  double peak = cat_peak_flops(dev, strcmp(prec, "fp8") ? prec : "bf16") * scale;
  double layers = (double)jint(d, "layers"), hidden = (double)jint(d, "hidden"), s = (double)jint(d, "seq");
  double mb = (double)jint(l, "micro_batch"), micro = (double)jint(l, "global_batch") / (mb * (double)jint(l, "dp"));
  double nb = ceil(s / COST_GEMM_TILE), share = (nb + 1) / (2 * nb);
  double fwd = 4 * mb * s * s * hidden * share * layers * micro; /* q k^T and P v over every head */
  int recompute = !strcmp(json_string_value(json_object_get(l, "recompute")), "full");
  return ((1 + recompute) * fwd / cost_attention_utilization(k, 0, dev) +
          2.5 * fwd / cost_attention_utilization(k, 1, dev)) / peak;
}

/* test_plan_fidelity --kernels HPDLC SOURCE_DIR FILE.json RUN: run RUN of
 * the set file (a long-context run on H100) under each --attention kernel.
 * FlashAttention-2 is slower than the tile model (flash) and runs at its
 * published rate (its floor binds, within 3%); FlashAttention-3 is faster
 * than FlashAttention-2 by a factor of at most the ratio of their published
 * rates (attention_floor_s); under the kernel the run's layout names (its
 * software's), the step time is within 20% of the published one. */
static int check_kernels(const char *hpdlc, const char *src, const char *file, const char *id) {
  json_error_t err;
  json_t *fig = json_load_file(file, 0, &err), *run = NULL;
  if (!fig) {
    fprintf(stderr, "fidelity: %s:%d: %s\n", file, err.line, err.text);
    return 2;
  }
  size_t i;
  json_t *r;
  json_array_foreach(json_object_get(fig, "runs"), i, r) {
    if (!strcmp(json_string_value(json_object_get(r, "id")), id)) run = r;
  }
  if (!run) {
    fprintf(stderr, "fidelity: no run %s in %s\n", id, file);
    json_decref(fig);
    return 2;
  }
  static const char *const kernels[] = {"flash", "flash1", "flash2", "flash3"};
  double step[4], attn[4];
  json_t *plan2 = NULL; /* the flash2 plan's report: its cluster */
  int failures = 0;
  for (int k = 0; k < 4; k++) {
    json_t *rk = json_deep_copy(run);
    json_object_set_new(json_object_get(rk, "layout"), "attention", json_string(kernels[k]));
    char cmd[4096];
    set_command(cmd, sizeof cmd, hpdlc, src, rk);
    json_t *out = run_plan(cmd);
    step[k] = out ? jget(out, "time", "step_s") : NAN;
    attn[k] = out ? jget(out, "time", "attention_s") : NAN;
    printf("%s --attention %-6s step %8.3f s, attention %8.3f s\n", id, kernels[k], step[k], attn[k]);
    if (k == 2) plan2 = json_incref(out);
    json_decref(out);
    json_decref(rk);
  }
  double pub = json_number_value(json_object_get(json_object_get(run, "published"), "step_s"));
  const char *own = json_string_value(json_object_get(json_object_get(run, "layout"), "attention"));
  int ko = own ? cost_attn_kernel_from_name(own) : 0;
  double e = step[ko < 0 ? 0 : ko] / pub - 1;
  int ok = fabs(e) <= 0.20;
  printf("under its own kernel (%s): %.3f s against %.3f s published, %+.1f%% (limit 20%%)  %s\n", own ? own : "flash",
         step[ko < 0 ? 0 : ko], pub, e * 100, ok ? "ok" : "FAIL");
  failures += !ok;
  ok = step[2] > step[0] && attn[2] > attn[0];
  printf("flash2 slower than flash: %.3f x the attention  %s\n", attn[2] / attn[0], ok ? "ok" : "FAIL");
  failures += !ok;
  double floor2 = attention_floor_s(run, plan2, COST_ATTN_FLASH2), floor3 = attention_floor_s(run, plan2, COST_ATTN_FLASH3);
  json_decref(plan2);
  if (isnan(floor2) || isnan(floor3)) {
    fprintf(stderr, "fidelity: %s: the plan's report names no catalog device with a peak: no kernel floors\n", id);
    json_decref(fig);
    return 2;
  }
  ok = fabs(attn[2] / floor2 - 1) <= 0.03;
  printf("flash2 at its published rate: attention %.3f s, FLOPs / (peak x U) %.3f s  %s\n", attn[2], floor2,
         ok ? "ok" : "FAIL");
  failures += !ok;
  double speedup = attn[2] / attn[3], most = floor2 / floor3;
  ok = speedup > 1 && speedup <= most * 1.03 && attn[3] >= floor3 * 0.97;
  printf("flash3 faster than flash2: %.3f x (at most %.3f, the ratio of their published rates)  %s\n", speedup, most,
         ok ? "ok" : "FAIL");
  failures += !ok;
  json_decref(fig);
  if (failures) fprintf(stderr, "%d attention kernel check(s) failed\n", failures);
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "--schema")) return check_schema(argv[2], argv[3]);
  if ((argc == 4 || (argc == 6 && !strcmp(argv[4], "--write"))) && !strcmp(argv[1], "--evidence"))
    return check_evidence(argv[2], argv[3], argc == 6 ? argv[5] : NULL);
  if (argc == 6 && !strcmp(argv[1], "--kernels")) return check_kernels(argv[2], argv[3], argv[4], argv[5]);
  if ((argc == 5 || argc == 6) && !strcmp(argv[1], "--set"))
    return check_set(argv[2], argv[3], argv[4], argc == 6 && !strcmp(argv[5], "--markdown"));
  int markdown = argc == 5 && !strcmp(argv[4], "--markdown");
  if (argc != 4 && !markdown) {
    fprintf(stderr, "usage: %s HPDLC SOURCE_DIR FIGURES.json [--markdown]\n", argv[0]);
    return 2;
  }
  const char *hpdlc = argv[1], *src = argv[2];
  json_error_t err;
  json_t *fig = json_load_file(argv[3], 0, &err);
  if (!fig) {
    fprintf(stderr, "fidelity: %s:%d: %s\n", argv[3], err.line, err.text);
    return 2;
  }
  double tol = json_number_value(json_object_get(json_object_get(fig, "tolerance"), "tflops_per_gpu_relative"));
  double ztol = json_number_value(json_object_get(json_object_get(fig, "tolerance"), "zero_model_states_relative"));
  int failures = 0;
  json_t *runs = json_object_get(fig, "runs");
  if (markdown) printf("| run | GPUs | published TFLOP/s | predicted | error |\n|---|---|---|---|---|\n");
  else printf("%-42s %6s %6s %6s %8s  %s\n", "run", "GPUs", "pub", "pred", "error", "");
  size_t i;
  json_t *r;
  json_array_foreach(runs, i, r) {
    json_t *l = json_object_get(r, "layout");
    char cmd[2048];
    figures_command(cmd, sizeof cmd, hpdlc, src, r);
    json_t *out = run_plan(cmd);
    double pub = json_number_value(json_object_get(r, "published_tflops_per_gpu"));
    double pred = out ? jget(out, "throughput", "tflops_per_gpu") : NAN;
    double e = pred / pub - 1;
    int asserted = json_is_true(json_object_get(r, "asserted"));
    int ok = isfinite(e) && fabs(e) <= tol;
    if (markdown)
      printf("| %s%s | %ld | %.0f | %.1f | %+.1f%% |\n", json_string_value(json_object_get(r, "id")),
             asserted ? "" : " (not asserted)", jint(l, "gpus"), pub, pred, e * 100);
    else
      printf("%-42s %6ld %6.0f %6.1f %+7.1f%%  %s\n", json_string_value(json_object_get(r, "id")), jint(l, "gpus"), pub,
             pred, e * 100, !asserted ? "(not asserted)" : ok ? "ok" : "FAIL");
    if (asserted && !ok) failures++;
    json_decref(out);
  }
  if (markdown) {
    json_decref(fig);
    return 0;
  }
  /* ZeRO model states, per parameter */
  json_t *z = json_object_get(fig, "zero_figure1");
  double psi = json_number_value(json_object_get(z, "params"));
  long dp = (long)json_integer_value(json_object_get(z, "dp"));
  json_t *pubgb = json_object_get(z, "published_GB");
  for (int stage = 0; stage <= 3; stage++) {
    char cmd[2048], key[4];
    snprintf(cmd, sizeof cmd,
             "'%s' plan '%s/samples/gpt.hpd' -D layers=36 -D hidden=4096 -D heads=32 --tp 1 --pp 1 --dp %ld --gpus %ld"
             " --micro-batch 1 --global-batch %ld --zero %d --cluster dgx-a100-80gb --format json",
             hpdlc, src, dp, dp, dp, stage);
    json_t *out = run_plan(cmd);
    snprintf(key, sizeof key, "%d", stage);
    double want = json_number_value(json_object_get(pubgb, key));
    double states = out ? jget(out, "memory_per_gpu", "params") + jget(out, "memory_per_gpu", "grads") +
                              jget(out, "memory_per_gpu", "optimizer")
                        : NAN;
    double params = out ? jget(out, "model", "params") : NAN;
    double got = states / params * psi / 1e9;
    double e = got / want - 1;
    int ok = isfinite(e) && fabs(e) <= ztol;
    printf("ZeRO stage %d, 7.5B at dp=%ld: %8.3f GB (published %.2f) %+6.2f%%  %s\n", stage, dp, got, want, e * 100,
           ok ? "ok" : "FAIL");
    if (!ok) failures++;
    json_decref(out);
  }
  json_decref(fig);
  if (failures) fprintf(stderr, "%d fidelity check(s) failed\n", failures);
  return failures ? 1 : 0;
}
