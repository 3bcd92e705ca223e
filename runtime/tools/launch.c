/* launch.c - the sbatch script and the MPIJob manifest of a compiled job. */
#include "launch.h"

#include <ctype.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int is_cuda(const Artifact *a) { return a->target && !strcmp(a->target, "cuda"); }

int launch_shape(const Artifact *a, const LaunchOptions *o, LaunchShape *s, RtErr *e) {
  memset(s, 0, sizeof *s);
  s->ranks = a->world_size;
  int per = o->ranks_per_node;
  /* A cluster of GPU nodes holds gpus_per_node ranks a node. CPU ranks
   * planned on one shared machine (the laptop cluster), or a manifest that
   * does not say, run on one node. */
  if (per <= 0) per = a->gpus_per_node > 0 && !a->cluster_shared ? a->gpus_per_node : s->ranks;
  if (per > s->ranks) per = s->ranks;
  if (per < 1) return rt_fail(e, "the artifact has no ranks");
  if (a->layout.tp > per)
    return rt_fail(e, "%d rank%s a node would split the tensor groups (tp=%d) over nodes: give --ranks-per-node a multiple of %d",
                   per, per == 1 ? "" : "s", a->layout.tp, a->layout.tp);
  s->ranks_per_node = per;
  s->nodes = (s->ranks + per - 1) / per;
  s->last_node_ranks = s->ranks - (s->nodes - 1) * per;
  s->gpus_per_node = is_cuda(a) ? per : 0;
  if (o->cpus_per_task > 0) {
    s->cpus_per_task = o->cpus_per_task;
    s->cpus_why = "--cpus-per-task";
  } else if (o->cpus_per_node > 0) {
    s->cpus_per_task = o->cpus_per_node / per > 0 ? o->cpus_per_node / per : 1;
    s->cpus_why = "--cpus-per-node / ranks per node";
  } else {
    s->cpus_per_task = is_cuda(a) ? LAUNCH_DEFAULT_CPUS_GPU : LAUNCH_DEFAULT_CPUS_CPU;
    s->cpus_why = "the default: the cores of a node are not known; --cpus-per-node or --cpus-per-task set them";
  }
  return 0;
}

/* ---- names ---- */

static void printable(char *out, size_t n, const char *s) {
  /* for messages: a name with a newline or an escape shows as it is harmless */
  size_t k = 0;
  for (; *s && k + 5 < n; s++) {
    unsigned char c = (unsigned char)*s;
    if (c < 0x20 || c == 0x7f) k += (size_t)snprintf(out + k, n - k, "\\x%02x", c);
    else out[k++] = (char)c;
  }
  out[k] = 0;
}

int launch_check_k8s_name(const char *what, const char *s, int max, int as_1035, RtErr *e) {
  char shown[160];
  printable(shown, sizeof shown, s);
  size_t n = strlen(s);
  const char *rule = as_1035 ? "a DNS-1035 label: lower-case letters, digits and '-', starting with a letter and ending with a letter "
                               "or digit"
                             : "a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit";
  if (n == 0) return rt_fail(e, "%s is empty; Kubernetes wants %s", what, rule);
  if ((int)n > max) return rt_fail(e, "%s '%s' has %zu characters, more than the %d Kubernetes allows here", what, shown, n, max);
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
      return rt_fail(e, "%s '%s' has '%s%c' at %zu; Kubernetes wants %s", what, shown, c == '\'' ? "\\" : "",
                     (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f ? c : '?', i + 1, rule);
  }
  if (s[0] == '-' || s[n - 1] == '-' || (as_1035 && !(s[0] >= 'a' && s[0] <= 'z')))
    return rt_fail(e, "%s '%s' is not %s", what, shown, rule);
  return 0;
}

int launch_check_slurm_word(const char *what, const char *s, int comma, RtErr *e) {
  char shown[160];
  printable(shown, sizeof shown, s);
  if (!*s) return rt_fail(e, "%s is empty", what);
  for (const char *p = s; *p; p++)
    if (!(isalnum((unsigned char)*p) || strchr("._+-", *p) || (comma && *p == ',')))
      return rt_fail(e, "%s '%s': only letters, digits, '.', '_', '+', '-'%s, please (an #SBATCH line and a shell take those as they are)",
                     what, shown, comma ? " and ','" : "");
  return 0;
}

int launch_check_slurm_time(const char *s, RtErr *e) {
  char shown[160];
  printable(shown, sizeof shown, s);
  const char *p = s;
  int fields = 0, day = 0;
  for (;;) {
    if (!isdigit((unsigned char)*p)) break;
    while (isdigit((unsigned char)*p)) p++;
    fields++;
    if (*p == '-' && !day && fields == 1) {
      day = 1;
      fields = 0;
      p++;
      continue;
    }
    if (*p != ':') break;
    p++;
  }
  if (*p || fields < 1 || fields > 3)
    return rt_fail(e, "--time '%s': SLURM takes MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS", shown);
  return 0;
}

void launch_shell_word(FILE *f, const char *s) {
  int plain = *s != 0;
  for (const char *p = s; *p && plain; p++) plain = isalnum((unsigned char)*p) || strchr("_./=:,@%+-", *p);
  if (plain) {
    fputs(s, f);
    return;
  }
  fputc('\'', f);
  for (const char *p = s; *p; p++) {
    if (*p == '\'') fputs("'\\''", f);
    else fputc(*p, f);
  }
  fputc('\'', f);
}

/* A comment line's text: no newline or control character ends the comment. */
static void comment_text(FILE *f, const char *s) {
  for (; s && *s; s++) fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, f);
}

static void describe(FILE *f, const char *lead, const Artifact *a, const LaunchShape *s) {
  fprintf(f, "%s hpdl job: ", lead);
  comment_text(f, a->model ? a->model : "?");
  fprintf(f, " (%s), %d rank%s (dp=%d tp=%d pp=%d cp=%d) on %d node%s x %d rank%s", is_cuda(a) ? "cuda" : "cpu", s->ranks,
          s->ranks == 1 ? "" : "s", a->layout.dp, a->layout.tp, a->layout.pp, a->layout.cp, s->nodes, s->nodes == 1 ? "" : "s",
          s->ranks_per_node, s->ranks_per_node == 1 ? "" : "s");
  if (s->last_node_ranks != s->ranks_per_node) fprintf(f, " (the last node %d)", s->last_node_ranks);
  fprintf(f, "\n%s cluster ", lead);
  comment_text(f, a->cluster_name ? a->cluster_name : "(not recorded: one node)");
  if (a->gpus_per_node > 0)
    fprintf(f, ", %d %s%s a node", a->gpus_per_node, a->cluster_shared ? "CPU rank" : "GPU", a->gpus_per_node == 1 ? "" : "s");
  fprintf(f, "; %d CPU%s a rank (%s)\n", s->cpus_per_task, s->cpus_per_task == 1 ? "" : "s", s->cpus_why);
}

/* The hpdlrun command line the ranks run: DIR, --resume, the run flags. */
static void run_words(FILE *f, const LaunchOptions *o) {
  launch_shell_word(f, o->hpdlrun);
  fputc(' ', f);
  launch_shell_word(f, o->dir);
  fputs(" --resume", f);
  for (int i = 0; i < o->nrun_args; i++) {
    fputc(' ', f);
    launch_shell_word(f, o->run_args[i]);
  }
}

/* ---- SLURM ---- */

int launch_write_sbatch(FILE *f, const Artifact *a, const LaunchOptions *o, RtErr *e) {
  LaunchShape s;
  if (launch_shape(a, o, &s, e) < 0) return -1;
  const char *job = o->job_name ? o->job_name : "hpdl";
  if (launch_check_slurm_word("--job-name", job, 0, e) < 0) return -1;
  if (o->partition && launch_check_slurm_word("--partition", o->partition, 1, e) < 0) return -1;
  if (o->account && launch_check_slurm_word("--account", o->account, 0, e) < 0) return -1;
  if (o->mpi && launch_check_slurm_word("--mpi", o->mpi, 0, e) < 0) return -1;
  if (o->time && launch_check_slurm_time(o->time, e) < 0) return -1;
  const char *out = o->output ? o->output : "%x-%j.out";
  for (const char *p = out; *p; p++)
    if (isspace((unsigned char)*p) || (unsigned char)*p < 0x20 || strchr("'\"\\$`", *p))
      return rt_fail(e, "--output: no spaces, quotes, '\\', '$' or '`' in an #SBATCH line's path, please");
  int sig = o->signal_s > 0 ? o->signal_s : LAUNCH_DEFAULT_SIGNAL_S;
  if (sig > 65535) return rt_fail(e, "--signal-before %d: SLURM sends the warning at most 65535 s before the limit", sig);

  fprintf(f, "#!/bin/bash\n");
  describe(f, "#", a, &s);
  fprintf(f, "# Written by hpdlrun --sbatch; submit with sbatch FILE (docs/runtime.md, \"Clusters: SLURM and Kubernetes\").\n");
  fprintf(f, "#SBATCH --job-name=%s\n", job);
  fprintf(f, "#SBATCH --nodes=%d\n", s.nodes);
  fprintf(f, "#SBATCH --ntasks=%d\n", s.ranks);
  fprintf(f, "#SBATCH --ntasks-per-node=%d\n", s.ranks_per_node);
  if (s.gpus_per_node) fprintf(f, "#SBATCH --gpus-per-node=%d\n", s.gpus_per_node);
  fprintf(f, "#SBATCH --cpus-per-task=%d\n", s.cpus_per_task);
  if (o->partition) fprintf(f, "#SBATCH --partition=%s\n", o->partition);
  if (o->account) fprintf(f, "#SBATCH --account=%s\n", o->account);
  if (o->time) fprintf(f, "#SBATCH --time=%s\n", o->time);
  fprintf(f, "#SBATCH --output=%s\n", out);
  fprintf(f, "#SBATCH --open-mode=append\n");
  fprintf(f, "#SBATCH --requeue\n");
  fprintf(f, "#SBATCH --signal=B:USR1@%d\n", sig);
  fprintf(f,
          "\n"
          "# %d s before the time limit SLURM sends SIGUSR1 to this script (--signal above). It asks\n"
          "# the ranks to finish their step, write a checkpoint and stop (SIGTERM to the job's steps,\n"
          "# not to this script: hpdlrun's ranks answer it so), and requeues the job: its next run\n"
          "# goes on from that checkpoint (--resume). scancel --signal=TERM JOBID does the same\n"
          "# without the requeue; a preemption's SIGTERM reaches the ranks from SLURM itself.\n"
          "set -u\n"
          "requeue=0\n"
          "on_time_limit() {\n"
          "  echo \"hpdl: the time limit is near: the ranks checkpoint and stop; the job will be requeued\"\n"
          "  requeue=1\n"
          "  scancel --signal=TERM \"$SLURM_JOB_ID\"\n"
          "}\n"
          "trap on_time_limit USR1\n"
          "\n"
          "# the train block's relative paths (data, checkpoints) as where hpdlrun --sbatch ran\n"
          "cd ",
          sig);
  launch_shell_word(f, o->workdir);
  fprintf(f, " || exit 1\n"
             "# BLAS threads of a rank: the CPUs SLURM gives it\n"
             "export OMP_NUM_THREADS=\"${SLURM_CPUS_PER_TASK:-%d}\"\n"
             "\n"
             "# Each task is one rank: hpdlrun sees srun's SLURM_PROCID and SLURM_STEP_ID and joins\n"
             "# the job's MPI world (no mpirun); rank r runs on node r / %d, so a tensor group\n"
             "# stays on one node.\n",
          s.cpus_per_task, s.ranks_per_node);
  fprintf(f, "srun --nodes=%d --ntasks=%d --ntasks-per-node=%d --cpus-per-task=%d", s.nodes, s.ranks, s.ranks_per_node,
          s.cpus_per_task);
  if (s.gpus_per_node) fprintf(f, " --gpus-per-node=%d", s.gpus_per_node);
  fprintf(f, " --distribution=block");
  if (o->mpi) fprintf(f, " --mpi=%s", o->mpi);
  fprintf(f, " \\\n  ");
  run_words(f, o);
  fprintf(f, " &\n"
             "pid=$!\n"
             "# wait returns early when the trap runs: wait again until srun has ended\n"
             "while :; do\n"
             "  wait \"$pid\"\n"
             "  rc=$?\n"
             "  kill -0 \"$pid\" 2>/dev/null || break\n"
             "done\n"
             "if [ \"$requeue\" = 1 ]; then\n"
             "  echo \"hpdl: the ranks stopped (status $rc); requeueing job $SLURM_JOB_ID\"\n"
             "  scontrol requeue \"$SLURM_JOB_ID\"\n"
             "fi\n"
             "exit \"$rc\"\n");
  return ferror(f) ? rt_fail(e, "cannot write the script") : 0;
}

/* ---- YAML ----
 * The manifest is built as a JSON tree and written as block YAML. Every
 * string is a double-quoted scalar with JSON's escapes (a subset of YAML's),
 * so no name, path or flag can end a line, open a comment or change a type;
 * sequences of scalars are written in flow style (JSON is YAML). */

static int plain_key(const char *k) {
  if (!isalpha((unsigned char)k[0])) return 0;
  static const char *const words[] = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (!strcasecmp(k, words[i])) return 0;
  for (const char *p = k; *p; p++)
    if (!(isalnum((unsigned char)*p) || strchr("._/-", *p))) return 0;
  return 1;
}

static void yaml_flow(FILE *f, const json_t *v) {
  char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_ENSURE_ASCII | JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (s) {
    /* compact: flow mappings (which need ": ") are never written; only
     * scalars and sequences of them go through here */
    fputs(s, f);
    free(s);
  }
}

static void yaml_key(FILE *f, const char *k) {
  if (plain_key(k)) {
    fputs(k, f);
  } else {
    json_t *s = json_string(k);
    yaml_flow(f, s);
    json_decref(s);
  }
}

static int all_scalars(const json_t *arr) {
  size_t i;
  json_t *x;
  json_array_foreach(arr, i, x) if (json_is_object(x) || json_is_array(x)) return 0;
  return 1;
}

static void yaml_value(FILE *f, const json_t *v, int indent);

/* first_inline: the first key goes on the current line (after "- ") */
static void yaml_mapping(FILE *f, const json_t *obj, int indent, int first_inline) {
  const char *k;
  json_t *x;
  int first = 1;
  json_object_foreach((json_t *)obj, k, x) {
    if (!(first && first_inline)) fprintf(f, "%*s", indent, "");
    first = 0;
    yaml_key(f, k);
    fputc(':', f);
    yaml_value(f, x, indent + 2);
  }
}

static void yaml_value(FILE *f, const json_t *v, int indent) {
  if (json_is_object(v) && json_object_size(v) > 0) {
    fputc('\n', f);
    yaml_mapping(f, v, indent, 0);
  } else if (json_is_array(v) && json_array_size(v) > 0 && !all_scalars(v)) {
    fputc('\n', f);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      fprintf(f, "%*s- ", indent, "");
      if (json_is_object(x) && json_object_size(x) > 0) {
        yaml_mapping(f, x, indent + 2, 1);
      } else {
        yaml_flow(f, x);
        fputc('\n', f);
      }
    }
  } else {
    fputc(' ', f);
    yaml_flow(f, v);
    fputc('\n', f);
  }
}

/* ---- Kubernetes ---- */

static json_t *container(const char *name, const char *image, const char *workdir, json_t *command, json_t *env, json_t *limits,
                         const char *mount) {
  json_t *c = json_pack("{s:s, s:s, s:s}", "name", name, "image", image, "workingDir", workdir);
  json_object_set_new(c, "command", command);
  if (env) json_object_set_new(c, "env", env);
  if (limits) json_object_set_new(c, "resources", json_pack("{s:o}", "limits", limits));
  json_object_set_new(c, "volumeMounts", json_pack("[{s:s, s:s}]", "name", "hpdl", "mountPath", mount));
  return c;
}

static json_t *pod(json_t *container_, const char *claim) {
  return json_pack("{s:{s:{s:i, s:[o], s:[{s:s, s:{s:s}}]}}}", "template", "spec", "terminationGracePeriodSeconds",
                   LAUNCH_DEFAULT_SIGNAL_S, "containers", container_, "volumes", "name", "hpdl", "persistentVolumeClaim",
                   "claimName", claim);
}

/* the path of the artifact in the pods: its folder's name under the mount */
static char *pod_path(const char *mount, const char *dir) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  size_t b = n;
  while (b > 0 && dir[b - 1] != '/') b--;
  size_t len = strlen(mount) + 1 + (n - b) + 1;
  char *p = malloc(len);
  if (p) snprintf(p, len, "%s/%.*s", mount, (int)(n - b), dir + b);
  return p;
}

int launch_write_mpijob(FILE *f, const Artifact *a, const LaunchOptions *o, RtErr *e) {
  LaunchShape s;
  if (launch_shape(a, o, &s, e) < 0) return -1;
  /* The operator names the pods NAME-launcher and NAME-worker-I, and their
   * host names must be DNS labels of at most 63 characters. */
  int digits = 1;
  for (int n = s.nodes - 1; n >= 10; n /= 10) digits++;
  int suffix = (int)strlen("-worker-") + digits, launcher_suffix = (int)strlen("-launcher");
  int max = 63 - (suffix > launcher_suffix ? suffix : launcher_suffix);
  if (launch_check_k8s_name("--name", o->name, max, 1, e) < 0) return -1;
  if (o->namespace_ && launch_check_k8s_name("--namespace", o->namespace_, 63, 0, e) < 0) return -1;
  if (launch_check_k8s_name("--claim", o->claim, 253, 0, e) < 0) return -1;
  const char *img = o->image;
  if (!*img) return rt_fail(e, "--image is empty");
  for (const char *p = img; *p; p++)
    if ((unsigned char)*p <= 0x20 || *p == 0x7f) return rt_fail(e, "--image: no spaces or control characters in an image name");
  if (o->mount[0] != '/') return rt_fail(e, "--mount wants an absolute path, not %s", o->mount);
  char *art = pod_path(o->mount, o->dir);
  if (!art) return rt_fail(e, "out of memory");

  /* The launcher runs hpdlrun, which starts the ranks on the workers with
   * mpirun (the operator's hostfile) and turns a SIGTERM into the ranks'
   * checkpoint and stop; --mpirun: even one rank runs on a worker. */
  json_t *cmd = json_pack("[s, s, s, o, s, s]", "hpdlrun", "--mpirun", "-np", json_sprintf("%d", s.ranks), art, "--resume");
  /* Kubernetes expands $(VAR) in a command and reads $$ as $: every $ doubled */
  for (int i = 0; i < o->nrun_args; i++) {
    size_t n = 0;
    for (const char *p = o->run_args[i]; *p; p++) n += *p == '$' ? 2 : 1;
    char *w = malloc(n + 1), *q = w;
    if (!w) break;
    for (const char *p = o->run_args[i]; *p; p++) {
      if (*p == '$') *q++ = '$';
      *q++ = *p;
    }
    *q = 0;
    json_array_append_new(cmd, json_string(w));
    free(w);
  }
  json_t *env = json_pack("[{s:s, s:s}, {s:s, s:o}]", "name", "HPDL_MPIRUN_ARGS", "value", "--map-by slot --bind-to none", "name",
                          "OMP_NUM_THREADS", "value", json_sprintf("%d", s.cpus_per_task));
  json_t *launcher = container("launcher", img, o->mount, cmd, env, json_pack("{s:s}", "cpu", "1"), o->mount);
  json_t *limits = s.gpus_per_node ? json_pack("{s:i}", "nvidia.com/gpu", s.gpus_per_node)
                                   : json_pack("{s:i}", "cpu", s.ranks_per_node * s.cpus_per_task);
  json_t *worker =
      container("worker", img, o->mount, json_pack("[s, s]", "/usr/sbin/sshd", "-De"), NULL, limits, o->mount);

  json_t *meta = json_pack("{s:s}", "name", o->name);
  if (o->namespace_) json_object_set_new(meta, "namespace", json_string(o->namespace_));
  json_object_set_new(meta, "labels", json_pack("{s:s}", "app.kubernetes.io/name", "hpdl"));
  json_t *spec = json_pack("{s:i, s:{s:s, s:i}, s:s}", "slotsPerWorker", s.ranks_per_node, "runPolicy", "cleanPodPolicy", "Running",
                           "backoffLimit", 3, "mpiImplementation", "OpenMPI");
  json_t *lspec = pod(launcher, o->claim), *wspec = pod(worker, o->claim);
  json_t *ls = json_pack("{s:i, s:s}", "replicas", 1, "restartPolicy", "OnFailure");
  json_object_update(ls, lspec);
  json_t *ws = json_pack("{s:i, s:s}", "replicas", s.nodes, "restartPolicy", "Never");
  json_object_update(ws, wspec);
  json_decref(lspec);
  json_decref(wspec);
  json_object_set_new(spec, "mpiReplicaSpecs", json_pack("{s:o, s:o}", "Launcher", ls, "Worker", ws));
  json_t *root = json_pack("{s:s, s:s, s:o, s:o}", "apiVersion", "kubeflow.org/v2beta1", "kind", "MPIJob", "metadata", meta, "spec",
                           spec);
  if (!root) {
    free(art);
    return rt_fail(e, "out of memory");
  }

  describe(f, "#", a, &s);
  fprintf(f, "# Written by hpdlrun --k8s; apply with kubectl apply -f FILE (the MPI operator v2,\n"
             "# kubeflow/mpi-operator, installed). The image has hpdlrun, Open MPI and sshd; the volume\n"
             "# of claim ");
  comment_text(f, o->claim);
  fprintf(f, ", mounted at ");
  comment_text(f, o->mount);
  fprintf(f, " in every pod, holds the artifact (");
  comment_text(f, art);
  fprintf(f, ")\n# and the data, and keeps the checkpoints: docs/runtime.md, \"Clusters: SLURM and Kubernetes\".\n");
  yaml_mapping(f, root, 0, 0);
  json_decref(root);
  free(art);
  return ferror(f) ? rt_fail(e, "cannot write the manifest") : 0;
}
