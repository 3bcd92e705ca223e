/* hpdlrun.c - runs a compiled job: `hpdlrun [-np N] DIR [options]`.
 *
 * Not under a launcher (no OMPI_COMM_WORLD_SIZE, PMI_RANK, PMIX_RANK, or
 * srun's SLURM_PROCID + SLURM_STEP_ID), a job of N > 1 ranks re-executes
 * itself under `mpirun -np N`; a job of one rank runs in this process
 * without MPI. Under mpirun or srun it uses the ranks it is given, which
 * must match the artifact's world size. See docs/runtime.md. */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "artifact.h"
#include "comm.h"
#include "cores.h"
#include "gemm16.h"
#include "device.h"
#include "launch.h"
#include "rt.h"
#include "train.h"

#ifndef HPDL_VERSION
#define HPDL_VERSION "0"
#endif

static void usage(FILE *f) {
  fprintf(f,
          "usage: hpdlrun [-np N] DIR [options]\n"
          "Runs the job that `hpdlc compile` wrote into DIR, on N ranks (default: the artifact's).\n"
          "\n"
          "  -np N, -n N              ranks to start (must equal the artifact's world size)\n"
          "  --steps N                optimizer steps in all (default: the train block's)\n"
          "  --stop-at N              stop after step N, saving a checkpoint (the schedule still spans --steps)\n"
          "  --data GLOB              token shards (llm.c .bin layout); default: the train block's\n"
          "  --seed N                 initialisation and data-order seed\n"
          "  --log-every N            steps between log lines\n"
          "  --checkpoint-dir DIR     where checkpoints go (the final state is always saved there)\n"
          "  --checkpoint-every N     also every N steps\n"
          "  --checkpoint-keep K      keep the newest K checkpoints (0: all)\n"
          "  --checkpoint-async       write checkpoints in the background\n"
          "  --resume                 continue from the newest checkpoint in the checkpoint folder\n"
          "                           (starts from step 0 when there is none yet)\n"
          "  --resume-from PATH       continue from this checkpoint (its .json manifest, or a folder)\n"
          "  --init-from FILE         start the parameters from a safetensors file (every parameter under its\n"
          "                           manifest name; a checkpoint's tensor file works): step 0, fresh optimizer\n"
          "  --metrics FILE           JSON lines, one per step: step, loss, lr, grad_norm, tokens_per_s, ...\n"
          "  --eval-every N           after every N-th step and the last, the validation loss in evaluation\n"
          "                           mode (batch norm's running statistics, no dropout): val_loss in the\n"
          "                           metrics and a log line\n"
          "  --eval-steps K           steps of validation data each time (default 10)\n"
          "  --eval-data GLOB         the validation data (default: the training data's _train_ read as _val_)\n"
          "  --profile FILE           a Chrome trace (Perfetto, chrome://tracing) of every rank: the steps and\n"
          "                           their phases, the program's forward / backward (and ops), every\n"
          "                           collective and message; rank 0 writes it at the end and prints\n"
          "                           a table of the top phases and ops, collectives' GB/s, peak memory\n"
          "  --profile-events N       events kept per rank (default 1000000; past it they are counted as dropped)\n"
          "  --progress MODE          auto (a live line on a terminal), tty, plain, quiet\n"
          "  --threads N              BLAS threads per rank (default: OPENBLAS_NUM_THREADS or\n"
          "                           OMP_NUM_THREADS when set, else cores / ranks on the node)\n"
          "  --device cuda|emulate    --target cuda artifacts: the GPU (default), or its kernels\n"
          "                           emulated on the CPU (an artifact compiled with --emulate)\n"
          "  --detect-anomaly         run the reference executor (fp64, slow) and stop at the first op\n"
          "                           that makes a NaN or +inf, naming it and its .hpd line\n"
          "  --allow-native           load the artifact's extern libraries (native code the .hpd file\n"
          "                           named; without it an artifact that has them is refused)\n"
          "  --info                   what this machine offers: MPI, BLAS, cores, the CUDA driver and\n"
          "                           GPUs, NVRTC, cuBLASLt, NCCL (each version, or why it is absent)\n"
          "  --mpirun                 start the ranks under mpirun even for one rank (an MPIJob's launcher)\n"
          "\n"
          "Clusters (docs/runtime.md, \"Clusters: SLURM and Kubernetes\"): the ranks placed on nodes as the\n"
          "artifact's cluster holds them; the run options above are passed on to the ranks, with --resume.\n"
          "  --sbatch DIR [-o FILE] [--submit] [--partition P] [--time T] [--job-name N] [--account A]\n"
          "           [--output LOG] [--mpi TYPE] [--hpdlrun PATH] [--signal-before S]\n"
          "                           an sbatch script (stdout, or FILE); --submit runs sbatch on it\n"
          "  --k8s DIR [-o FILE] [--image IMG] [--name N] [--namespace NS] [--claim PVC] [--mount PATH]\n"
          "                           a Kubeflow MPIJob (kubeflow.org/v2beta1) manifest\n"
          "  --ranks-per-node N       ranks a node holds (default: the cluster's GPUs a node)\n"
          "  --cpus-per-task N, --cpus-per-node N   CPUs of a rank (default 8 on GPUs, 4 on CPUs)\n"
          "  -h, --help               this help;  --version  the version\n"
          "\n"
          "Environment: HPDL_MPIRUN (the mpirun to use), HPDL_MPIRUN_ARGS (extra mpirun arguments).\n");
}

typedef struct {
  const char *dir;
  int np;
  int threads; /* --threads; 0: choose */
  int allow_native; /* --allow-native: the artifact's extern libraries may be loaded */
  int detect_anomaly; /* --detect-anomaly: the reference executor, every op's values checked */
  int mpirun;         /* --mpirun: under mpirun even for one rank */
  TrainOptions t;
} Args;

static int bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "hpdlrun: error: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(hpdlrun --help lists the options)\n");
  return 2;
}

static int parse_i64(const char *s, int64_t min, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || !*s || *end || v < min) return -1;
  *out = v;
  return 0;
}

/* The BLAS the CPU program will load: OpenBLAS's own word for its build
 * and the core it picked, else which library opened. */
static void blas_info(char *buf, size_t n) {
  const char *names[] = {"libopenblas.so.0", "libblis.so.4", "libcblas.so.3", "libblas.so.3"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    void *h = dlopen(names[i], RTLD_LAZY | RTLD_LOCAL);
    if (!h) continue;
    char *(*config)(void) = NULL, *(*core)(void) = NULL;
    *(void **)&config = dlsym(h, "openblas_get_config");
    *(void **)&core = dlsym(h, "openblas_get_corename");
    if (config) snprintf(buf, n, "%s (core %s)", config(), core ? core() : "?");
    else snprintf(buf, n, "%s", names[i]);
    return; /* left loaded: what its initialiser allocated stays its own */
  }
  snprintf(buf, n, "none found (%s, ...): the CPU program's GEMMs need one", names[0]);
}

/* hpdlrun --info: one line per part of what a job would run on. */
static void print_info(void) {
  char buf[512];
  printf("hpdlrun %s\n", HPDL_VERSION);
#ifdef HPDL_HAVE_MPI
  comm_mpi_library(buf, sizeof buf);
  printf("  MPI          %s%s\n", buf, comm_under_launcher() ? ", under a launcher now" : "");
#else
  printf("  MPI          none: built without MPI, one-rank jobs only\n");
#endif
  blas_info(buf, sizeof buf);
  printf("  BLAS         %s\n", buf);
  printf("  bf16 GEMMs   %s\n", gemm16_backend());
  CoresChoice c = cores_choose(0, 1);
  cores_describe(&c, buf, sizeof buf);
  printf("  cores        %d online; a one-rank job runs %s\n", c.cores, buf);
  fflush(stdout);
  dev_info(stdout);
  fflush(stdout);
}

/* "--flag=VALUE": name "--flag" and *val VALUE; otherwise name is the
 * argument (cut at the buffer) and *val stays. */
static void split_flag(char *arg, char *name, size_t n, char **val) {
  snprintf(name, n, "%s", arg);
  char *eq = strchr(name, '=');
  if (!strncmp(arg, "--", 2) && eq) {
    *eq = 0;
    *val = strchr(arg, '=') + 1;
  }
}

/* An option's value from the next argument, unless that is another option
 * (`--steps --seed 3`: "--steps needs a value", not "--seed" read as the
 * count); NULL then, or at the end. Both parsers' VALUE() take it. */
static char *next_value(int argc, char **argv, int *i) {
  if (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2)) return NULL;
  return argv[++*i];
}

/* Returns 0, or the exit status (2: bad command line; -1: help shown). */
static int parse_args(int argc, char **argv, Args *A) {
  memset(A, 0, sizeof *A);
  train_options_defaults(&A->t);
  for (int i = 1; i < argc; i++) {
    char *arg = argv[i], *val = NULL;
    char name[64];
    split_flag(arg, name, sizeof name, &val);
    const char *n = name;
#define VALUE()                                                              \
  do {                                                                       \
    if (!val && !(val = next_value(argc, argv, &i)))                         \
      return bad_usage("%s needs a value", n);                               \
  } while (0)
    int64_t v;
    if (!strcmp(n, "-h") || !strcmp(n, "--help")) {
      usage(stdout);
      return -1;
    } else if (!strcmp(n, "--version")) {
#ifdef HPDL_HAVE_MPI
      printf("hpdlrun %s (collectives: mpi)\n", HPDL_VERSION);
#else
      printf("hpdlrun %s (collectives: none; built without MPI, one-rank jobs only)\n", HPDL_VERSION);
#endif
      return -1;
    } else if (!strcmp(n, "--info")) {
      print_info();
      return -1;
    } else if (!strcmp(n, "--allow-native")) {
      A->allow_native = 1;
    } else if (!strcmp(n, "--mpirun")) {
      A->mpirun = 1;
    } else if (!strcmp(n, "--detect-anomaly")) {
      A->detect_anomaly = 1;
    } else if (!strcmp(n, "-np") || !strcmp(n, "-n") || !strcmp(n, "--np")) {
      VALUE();
      if (parse_i64(val, 1, &v) < 0 || v > 1 << 20) return bad_usage("-np wants a positive number of ranks, not %s", val);
      A->np = (int)v;
    } else if (!strcmp(n, "--steps")) {
      VALUE();
      if (parse_i64(val, 0, &A->t.steps) < 0) return bad_usage("--steps wants a number >= 0, not %s", val);
    } else if (!strcmp(n, "--stop-at")) {
      VALUE();
      if (parse_i64(val, 1, &A->t.stop_at) < 0) return bad_usage("--stop-at wants a step >= 1, not %s", val);
    } else if (!strcmp(n, "--data")) {
      VALUE();
      A->t.data = val;
    } else if (!strcmp(n, "--seed")) {
      VALUE();
      if (parse_i64(val, 0, &A->t.seed) < 0) return bad_usage("--seed wants a number >= 0, not %s", val);
    } else if (!strcmp(n, "--log-every")) {
      VALUE();
      if (parse_i64(val, 1, &A->t.log_every) < 0) return bad_usage("--log-every wants a number >= 1, not %s", val);
    } else if (!strcmp(n, "--checkpoint-dir")) {
      VALUE();
      A->t.ckpt_dir = val;
    } else if (!strcmp(n, "--checkpoint-every")) {
      VALUE();
      if (parse_i64(val, 0, &A->t.ckpt_every) < 0) return bad_usage("--checkpoint-every wants a number >= 0, not %s", val);
    } else if (!strcmp(n, "--checkpoint-keep")) {
      VALUE();
      if (parse_i64(val, 0, &A->t.ckpt_keep) < 0) return bad_usage("--checkpoint-keep wants a number >= 0, not %s", val);
    } else if (!strcmp(n, "--checkpoint-async")) {
      A->t.ckpt_async = 1;
    } else if (!strcmp(n, "--resume")) {
      A->t.resume = 1;
    } else if (!strcmp(n, "--resume-from")) {
      VALUE();
      A->t.resume_from = val;
    } else if (!strcmp(n, "--init-from")) {
      VALUE();
      A->t.init_from = val;
    } else if (!strcmp(n, "--metrics")) {
      VALUE();
      A->t.metrics = val;
    } else if (!strcmp(n, "--eval-every")) {
      VALUE();
      if (parse_i64(val, 1, &A->t.eval_every) < 0) return bad_usage("--eval-every wants a number of steps >= 1, not %s", val);
    } else if (!strcmp(n, "--eval-steps")) {
      VALUE();
      if (parse_i64(val, 1, &A->t.eval_steps) < 0) return bad_usage("--eval-steps wants a number of steps >= 1, not %s", val);
    } else if (!strcmp(n, "--eval-data")) {
      VALUE();
      if (!*val) return bad_usage("--eval-data wants a file pattern");
      A->t.eval_data = val;
    } else if (!strcmp(n, "--profile")) {
      VALUE();
      if (!*val) return bad_usage("--profile wants a file name");
      A->t.profile = val;
    } else if (!strcmp(n, "--profile-events")) {
      VALUE();
      if (parse_i64(val, 1, &A->t.profile_cap) < 0 || A->t.profile_cap > ((int64_t)1 << 26))
        return bad_usage("--profile-events wants a number of events from 1 to 67108864, not %s", val);
    } else if (!strcmp(n, "--progress")) {
      VALUE();
      if (!strcmp(val, "auto")) A->t.progress = TRAIN_PROGRESS_AUTO;
      else if (!strcmp(val, "tty")) A->t.progress = TRAIN_PROGRESS_TTY;
      else if (!strcmp(val, "plain")) A->t.progress = TRAIN_PROGRESS_PLAIN;
      else if (!strcmp(val, "quiet")) A->t.progress = TRAIN_PROGRESS_QUIET;
      else return bad_usage("--progress is auto, tty, plain or quiet, not %s", val);
    } else if (!strcmp(n, "--device")) {
      VALUE();
      if (strcmp(val, "cuda") && strcmp(val, "emulate")) return bad_usage("--device is cuda or emulate, not %s", val);
      A->t.device = val;
    } else if (!strcmp(n, "--threads")) {
      VALUE();
      if (parse_i64(val, 1, &v) < 0 || v > 1 << 16) return bad_usage("--threads wants a number of threads >= 1, not %s", val);
      A->threads = (int)v;
    } else if (arg[0] == '-' && arg[1]) {
      return bad_usage("unknown option %s", arg);
    } else {
      if (A->dir) return bad_usage("one artifact folder, please (also got %s)", arg);
      A->dir = arg;
    }
#undef VALUE
  }
  if (!A->dir) {
    usage(stderr);
    return 2;
  }
  if (A->t.init_from && (A->t.resume || A->t.resume_from))
    return bad_usage("--init-from starts a run at step 0 from given weights; --resume%s continues one: choose one",
                     A->t.resume_from ? "-from" : "");
  return 0;
}

/* The rank this process will be, from the launcher's environment (before
 * MPI starts), so that only one rank prints an error all of them meet. */
static int env_rank(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
  for (int i = 0; i < 4; i++) {
    const char *v = getenv(vars[i]);
    if (v) return atoi(v);
  }
  return 0;
}

/* A rank's fatal error, printed once (by the rank that reports) and noted
 * in the file hpdlrun's launcher named (HPDL_REPORTED), so that the
 * launcher knows whether a failed job said why (mpirun runs --quiet). */
static void rank_error(const char *msg) {
  fprintf(stderr, "hpdlrun: error: %s\n", msg);
  fflush(stderr);
  rt_note_reported();
}

#ifdef HPDL_HAVE_MPI
static volatile sig_atomic_t child;    /* the mpirun to forward signals to */
static volatile sig_atomic_t stopping; /* the SIGTERM or SIGINT passed on as a stop request */

/* A first SIGTERM or SIGINT asks the ranks to checkpoint and stop: mpirun
 * passes SIGUSR1 / SIGUSR2 to every rank (it would answer SIGTERM itself by
 * killing the job within seconds). A second one, or SIGHUP, goes to mpirun
 * as it is. */
static void forward_signal(int sig) {
  if (child <= 0) return;
  if ((sig == SIGTERM || sig == SIGINT) && !stopping) {
    stopping = sig;
    static const char msg[] = "\nhpdlrun: stopping: the ranks finish this step and write a checkpoint (again to stop at once)\n";
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) { /* nothing to do about it in a handler */
    }
    kill((pid_t)child, sig == SIGTERM ? SIGUSR1 : SIGUSR2);
    return;
  }
  kill((pid_t)child, sig);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

/* Whether mpirun may place ranks on other machines: a host list or hostfile
 * among the extra arguments (Open MPI's spellings, one dash or two), or an
 * allocation of a resource manager, whose nodes mpirun uses unasked: those
 * jobs keep Open MPI's shared tree (a private one would be made on this
 * machine alone). */
static int may_span_hosts(const char *extra) {
  static const char *const flags[] = {"-H", "--host", "-host", "--hostfile", "-hostfile", "--machinefile",
                                      "-machinefile", "--default-hostfile", "-default-hostfile", "--rankfile",
                                      "-rankfile", "-rf", "orte_default_hostfile"};
  static const char *const managers[] = {"OMPI_MCA_orte_default_hostfile", "SLURM_JOB_ID", "PBS_NODEFILE",
                                         "LSB_MCPU_HOSTS", "PE_HOSTFILE"};
  for (size_t i = 0; i < sizeof managers / sizeof *managers; i++)
    if (getenv(managers[i])) return 1;
  for (const char *p = extra; p && *p;) {
    while (*p == ' ' || *p == '\t') p++;
    size_t len = strcspn(p, " \t=");
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
      if (len == strlen(flags[i]) && !strncmp(p, flags[i], len)) return 1;
    p += strcspn(p, " \t");
  }
  return 0;
}

/* Open MPI 4 keeps every job's session directory under one tree per user in
 * the temporary directory, and two mpiruns that start and end on a machine
 * at once race on it: one removes the emptied tree while the other makes
 * its job's directory in it, and the second job fails before any rank
 * starts ("ORTE_ERROR_LOG: Error in file util/session_dir.c";
 * open-mpi/ompi#7049, #8510). A job on this machine alone (may_span_hosts)
 * gets a tree of its own, removed after it; one the user placed
 * (OMPI_MCA_orte_tmpdir_base) stays where it is. Fills base ("" when none). */
static void private_session_base(char *base, size_t n) {
  base[0] = 0;
  if (getenv("OMPI_MCA_orte_tmpdir_base") || may_span_hosts(getenv("HPDL_MPIRUN_ARGS"))) return;
  const char *tmpdir = getenv("TMPDIR");
  snprintf(base, n, "%s/hpdlrun-ompi-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
  if (!mkdtemp(base)) {
    base[0] = 0; /* Open MPI's shared tree, as without us */
    return;
  }
  setenv("OMPI_MCA_orte_tmpdir_base", base, 1);
}

static int launch(int argc, char **argv, int np) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) snprintf(self, sizeof self, "%s", argv[0]);
  else self[n] = 0;
  const char *mpirun = getenv("HPDL_MPIRUN");
  if (!mpirun || !*mpirun) mpirun = "mpirun";
  setenv("HPDL_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
  char *extra = getenv("HPDL_MPIRUN_ARGS") ? strdup(getenv("HPDL_MPIRUN_ARGS")) : NULL;
  int cap = argc + 32;
  for (char *p = extra; p && *p; p++) cap += *p == ' ';
  char **av = calloc((size_t)cap, sizeof *av);
  if (!av) return 1;
  int k = 0;
  char npbuf[16];
  snprintf(npbuf, sizeof npbuf, "%d", np);
  av[k++] = (char *)mpirun;
  av[k++] = "-np";
  av[k++] = npbuf;
  /* A laptop has fewer cores than the ranks of a dp x tp x pp job. */
  av[k++] = "--oversubscribe";
  /* Open MPI's banners off; HPDL_MPIRUN_QUIET=0 keeps them (mpirun's own failures) */
  const char *quiet = getenv("HPDL_MPIRUN_QUIET");
  if (!quiet || strcmp(quiet, "0")) av[k++] = "--quiet";
  /* Open MPI refuses root unless told; containers often run as root. */
  if (geteuid() == 0) av[k++] = "--allow-run-as-root";
  for (char *tok = extra ? strtok(extra, " \t") : NULL; tok; tok = strtok(NULL, " \t")) av[k++] = tok;
  /* where a rank notes that it reported the job's error (rank_error) */
  char reported[PATH_MAX];
  const char *tmpdir = getenv("TMPDIR");
  snprintf(reported, sizeof reported, "%s/hpdlrun-%ld.reported", tmpdir && *tmpdir ? tmpdir : "/tmp", (long)getpid());
  unlink(reported);
  setenv("HPDL_REPORTED", reported, 1);
  const char *exports[] = {"HPDL_TTY", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "HPDL_FAULT", "HPDL_REPORTED"};
  for (int i = 0; i < 5; i++)
    if (getenv(exports[i])) {
      av[k++] = "-x";
      av[k++] = (char *)exports[i];
    }
  av[k++] = self;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-np") || !strcmp(argv[i], "-n") || !strcmp(argv[i], "--np")) {
      i++;
      continue;
    }
    if (!strncmp(argv[i], "--np=", 5)) continue;
    av[k++] = argv[i];
  }
  av[k] = NULL;
  char session_base[PATH_MAX];
  private_session_base(session_base, sizeof session_base);
  fflush(stdout);
  fflush(stderr);
  /* mpirun runs as our child, with --quiet: an error every rank agrees on
   * is reported once by hpdlrun itself, without Open MPI's banner; a rank
   * that dies (a crash, a kill) is reported here from the exit status. */
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "hpdlrun: error: cannot fork: %s\n", strerror(errno));
    if (session_base[0]) rmdir(session_base);
    free(av);
    free(extra);
    return 1;
  }
  if (pid == 0) {
    /* A process group of its own, so that a terminal's Ctrl-C reaches
     * hpdlrun alone (which asks the ranks to stop after a checkpoint), and
     * no stdin: mpirun would read the terminal for rank 0 from the background */
    setpgid(0, 0);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
      dup2(devnull, STDIN_FILENO);
      if (devnull != STDIN_FILENO) close(devnull);
    }
    execvp(mpirun, av);
    fprintf(stderr, "hpdlrun: error: cannot start %s: %s\n(install Open MPI: scripts/setup.sh; or set HPDL_MPIRUN)\n", mpirun,
            strerror(errno));
    _exit(127);
  }
  free(av);
  free(extra);
  child = pid;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      fprintf(stderr, "hpdlrun: error: waiting for mpirun: %s\n", strerror(errno));
      return 1;
    }
  if (session_base[0]) nftw(session_base, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (WIFSIGNALED(status)) {
    fprintf(stderr, "hpdlrun: error: mpirun was stopped by signal %d (%s)\n", WTERMSIG(status), strsignal(WTERMSIG(status)));
    return 128 + WTERMSIG(status);
  }
  int rc = WEXITSTATUS(status);
  int said = access(reported, F_OK) == 0;
  unlink(reported);
  if (stopping && rc == 0) return 128 + stopping; /* the ranks stopped as asked, saved */
  /* Open MPI exits with 128 + n when a rank dies of signal n. */
  if (rc > 128 && rc < 128 + 65)
    fprintf(stderr, "hpdlrun: error: a rank died of signal %d (%s); the job stopped\n", rc - 128, strsignal(rc - 128));
  else if (rc != 0 && !said)
    /* no rank said why: mpirun's own failure (its messages are quiet) or a
     * rank that exited without reporting */
    fprintf(stderr,
            "hpdlrun: error: %s exited with status %d and no rank reported an error\n"
            "hint: HPDL_MPIRUN_QUIET=0 shows Open MPI's own messages\n",
            mpirun, rc);
  return rc;
}

#endif

/* ---- hpdlrun --sbatch / --k8s: a cluster's job for the artifact ---- */

/* "hpdl-" and the model's name, with what a job name cannot hold as '-';
 * lower case for Kubernetes. */
static void default_name(const char *model, int lower, char *out, size_t n) {
  size_t k = (size_t)snprintf(out, n, "hpdl-");
  for (const char *p = model ? model : "job"; *p && k + 1 < n && k < 40; p++) {
    char c = *p;
    if (lower) c = (char)tolower((unsigned char)c);
    int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (!lower && ((c >= 'A' && c <= 'Z') || c == '_' || c == '.'));
    if (!ok) c = '-';
    if (c == '-' && out[k - 1] == '-') continue;
    out[k++] = c;
  }
  while (k > 0 && out[k - 1] == '-') k--;
  out[k] = 0;
}

/* Runs sbatch on the script and prints the job id: 0, or the exit status. */
static int submit(const char *script) {
  const char *sbatch = getenv("HPDL_SBATCH");
  if (!sbatch || !*sbatch) sbatch = "sbatch";
  int fd[2];
  if (pipe(fd) < 0) {
    fprintf(stderr, "hpdlrun: error: cannot make a pipe: %s\n", strerror(errno));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "hpdlrun: error: cannot fork: %s\n", strerror(errno));
    return 1;
  }
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], STDOUT_FILENO);
    close(fd[1]);
    execlp(sbatch, sbatch, "--parsable", script, (char *)NULL);
    /* told to the parent by status 127 and this line */
    fprintf(stderr, "hpdlrun: error: cannot run %s: %s (not a SLURM login node? the script %s is written: submit it there with "
                    "sbatch %s)\n", sbatch, strerror(errno), script, script);
    _exit(127);
  }
  close(fd[1]);
  char out[256] = "";
  size_t k = 0;
  ssize_t r;
  while ((r = read(fd[0], out + k, sizeof out - 1 - k)) > 0 || (r < 0 && errno == EINTR))
    if (r > 0) k += (size_t)r;
  out[k] = 0;
  close(fd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 127)
      fprintf(stderr, "hpdlrun: error: %s %s failed (status %d)\n", sbatch, script, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 1;
  }
  /* --parsable: "JOBID" or "JOBID;CLUSTER" */
  out[strcspn(out, ";\r\n")] = 0;
  printf("hpdlrun: submitted %s: job %s\n", script, out);
  return 0;
}

static int launch_main(int argc, char **argv) {
  LaunchOptions o;
  memset(&o, 0, sizeof o);
  const char *mode = NULL, *dir = NULL, *file = NULL;
  int want_submit = 0;
  char **rest = calloc((size_t)argc + 2, sizeof *rest);
  if (!rest) return 1;
  int nrest = 0;
  rest[nrest++] = argv[0];
  rest[nrest++] = NULL; /* the artifact folder, once known */
  int rc = 2;
  o.run_args = rest + 2;
  for (int i = 1; i < argc; i++) {
    char *arg = argv[i], *val = NULL;
    char name[64];
    split_flag(arg, name, sizeof name, &val);
    const char *n = name;
#define VALUE()                                                              \
  do {                                                                       \
    if (!val && !(val = next_value(argc, argv, &i))) {                       \
      rc = bad_usage("%s needs a value", n);                                 \
      goto out;                                                              \
    }                                                                        \
  } while (0)
#define COUNT(field)                                                                               \
  do {                                                                                             \
    int64_t v_;                                                                                    \
    VALUE();                                                                                       \
    if (parse_i64(val, 1, &v_) < 0 || v_ > 1 << 20) {                                              \
      rc = bad_usage("%s wants a number >= 1, not %s", n, val);                                    \
      goto out;                                                                                    \
    }                                                                                              \
    o.field = (int)v_;                                                                             \
  } while (0)
    if (!strcmp(n, "--sbatch") || !strcmp(n, "--k8s")) {
      if (mode) {
        rc = bad_usage("one of --sbatch and --k8s, please");
        goto out;
      }
      mode = n[2] == 's' ? "sbatch" : "k8s";
      VALUE();
      dir = val;
    } else if (!strcmp(n, "-o")) {
      VALUE();
      file = val;
    } else if (!strcmp(n, "--submit")) {
      want_submit = 1;
    } else if (!strcmp(n, "--partition")) {
      VALUE();
      o.partition = val;
    } else if (!strcmp(n, "--time")) {
      VALUE();
      o.time = val;
    } else if (!strcmp(n, "--job-name")) {
      VALUE();
      o.job_name = val;
    } else if (!strcmp(n, "--account")) {
      VALUE();
      o.account = val;
    } else if (!strcmp(n, "--output")) {
      VALUE();
      o.output = val;
    } else if (!strcmp(n, "--mpi")) {
      VALUE();
      o.mpi = val;
    } else if (!strcmp(n, "--hpdlrun")) {
      VALUE();
      o.hpdlrun = val;
    } else if (!strcmp(n, "--image")) {
      VALUE();
      o.image = val;
    } else if (!strcmp(n, "--name")) {
      VALUE();
      o.name = val;
    } else if (!strcmp(n, "--namespace")) {
      VALUE();
      o.namespace_ = val;
    } else if (!strcmp(n, "--claim")) {
      VALUE();
      o.claim = val;
    } else if (!strcmp(n, "--mount")) {
      VALUE();
      o.mount = val;
    } else if (!strcmp(n, "--signal-before")) {
      COUNT(signal_s);
    } else if (!strcmp(n, "--ranks-per-node")) {
      COUNT(ranks_per_node);
    } else if (!strcmp(n, "--cpus-per-task")) {
      COUNT(cpus_per_task);
    } else if (!strcmp(n, "--cpus-per-node")) {
      COUNT(cpus_per_node);
    } else if (!strcmp(n, "--resume")) {
      /* the job always passes it */
    } else if (!strcmp(n, "--init-from")) {
      rc = bad_usage("--init-from with --%s: a requeued or restarted job would start again from those weights; run the "
                     "first start without --%s, or put a checkpoint into the checkpoint folder",
                     mode ? mode : "sbatch", mode ? mode : "sbatch");
      goto out;
    } else if (!strcmp(n, "--resume-from")) {
      rc = bad_usage("--resume-from with --%s: a requeued or restarted job would go back to that checkpoint each time; copy it "
                     "into the checkpoint folder, which the job resumes from (--resume)",
                     mode ? mode : "sbatch");
      goto out;
    } else if (!strcmp(n, "--info") || !strcmp(n, "-h") || !strcmp(n, "--help") || !strcmp(n, "--version") ||
               !strcmp(n, "--mpirun")) {
      rc = bad_usage("%s does not go with --sbatch or --k8s", arg);
      goto out;
    } else if (arg[0] != '-' || !arg[1]) {
      rc = bad_usage("the artifact folder is --sbatch's or --k8s's value (also got %s)", arg);
      goto out;
    } else {
      /* a run option: checked below, passed on to the ranks */
      rest[nrest++] = arg;
      if (!val && i + 1 < argc && argv[i + 1][0] != '-' && strcmp(n, "--checkpoint-async") && strcmp(n, "--allow-native") &&
          strcmp(n, "--detect-anomaly"))
        rest[nrest++] = argv[++i];
    }
#undef COUNT
#undef VALUE
  }
  const int sbatch = !strcmp(mode, "sbatch");
  if (want_submit && !sbatch) {
    rc = bad_usage("--submit goes with --sbatch (apply an MPIJob with kubectl apply -f FILE)");
    goto out;
  }
  /* the run options as hpdlrun reads them, so that a mistake shows now, not on the cluster */
  rest[1] = (char *)dir;
  rest[nrest] = NULL;
  Args A;
  rc = parse_args(nrest, rest, &A);
  if (rc) {
    if (rc < 0) rc = 2;
    goto out;
  }
  rc = 1;
  RtErr e;
  Artifact *a = artifact_load(dir, &e);
  if (a && artifact_check_files(a, A.allow_native, &e) < 0) {
    artifact_free(a);
    a = NULL;
  }
  if (!a) {
    fprintf(stderr, "hpdlrun: error: %s\n", e.msg);
    goto out;
  }
  if (A.np && A.np != a->world_size) {
    fprintf(stderr, "hpdlrun: error: -np %d, but %s was compiled for %d ranks\n", A.np, dir, a->world_size);
    artifact_free(a);
    rc = 2;
    goto out;
  }
  /* -np is the artifact's: not passed on */
  int k = 0;
  for (int i = 2; i < nrest; i++) {
    if (!strcmp(rest[i], "-np") || !strcmp(rest[i], "-n") || !strcmp(rest[i], "--np")) {
      i++;
      continue;
    }
    if (!strncmp(rest[i], "--np=", 5)) continue;
    o.run_args[k++] = rest[i];
  }
  o.nrun_args = k;
  char name[64], self[PATH_MAX], absdir[PATH_MAX], cwd[PATH_MAX];
  default_name(a->model, !sbatch, name, sizeof name);
  if (!o.job_name) o.job_name = name;
  if (!o.name) o.name = name;
  if (!o.image) o.image = "hpdl:latest";
  if (!o.claim) o.claim = "hpdl";
  if (!o.mount) o.mount = "/hpdl";
  if (sbatch) {
    /* the job runs elsewhere in time and place: absolute paths */
    if (!realpath(dir, absdir)) snprintf(absdir, sizeof absdir, "%s", dir);
    o.dir = absdir;
    if (!o.hpdlrun) {
      ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
      if (len <= 0) snprintf(self, sizeof self, "hpdlrun");
      else self[len] = 0;
      o.hpdlrun = self;
    }
    o.workdir = getcwd(cwd, sizeof cwd) ? cwd : ".";
  } else {
    o.dir = dir;
    o.hpdlrun = "hpdlrun";
  }
  char autofile[96];
  if (want_submit && !file) {
    snprintf(autofile, sizeof autofile, "%s.sbatch", o.job_name);
    file = autofile;
  }
  FILE *f = stdout;
  char tmp[PATH_MAX + 32];
  if (file) {
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", file, (long)getpid());
    f = fopen(tmp, "w");
    if (!f) {
      fprintf(stderr, "hpdlrun: error: cannot write %s: %s\n", file, strerror(errno));
      artifact_free(a);
      goto out;
    }
  }
  int w = sbatch ? launch_write_sbatch(f, a, &o, &e) : launch_write_mpijob(f, a, &o, &e);
  LaunchShape shape;
  launch_shape(a, &o, &shape, &e);
  artifact_free(a);
  if (file) {
    if (fclose(f) != 0 && w == 0) w = rt_fail_errno(&e, errno, "cannot write %s", file);
    if (w == 0 && rename(tmp, file) != 0) w = rt_fail_errno(&e, errno, "cannot write %s", file);
    if (w < 0) unlink(tmp);
  } else if (fflush(stdout) != 0 && w == 0) {
    w = rt_fail(&e, "cannot write the standard output");
  }
  if (w < 0) {
    fprintf(stderr, "hpdlrun: error: %s\n", e.msg);
    goto out;
  }
  if (file)
    fprintf(stderr, "hpdlrun: wrote %s: %d rank%s on %d node%s x %d (%s)\n", file, shape.ranks, shape.ranks == 1 ? "" : "s",
            shape.nodes, shape.nodes == 1 ? "" : "s", shape.ranks_per_node,
            sbatch ? "sbatch FILE submits it" : "kubectl apply -f FILE starts it");
  rc = want_submit ? submit(file) : 0;
out:
  free(rest);
  return rc;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--sbatch") || !strcmp(argv[i], "--k8s") || !strncmp(argv[i], "--sbatch=", 9) ||
        !strncmp(argv[i], "--k8s=", 6))
      return launch_main(argc, argv);
  Args A;
  int rc = parse_args(argc, argv, &A);
  if (rc) return rc < 0 ? 0 : rc;
  int launched = comm_under_launcher();
  int rank = launched ? env_rank() : 0;
  RtErr e;
  Artifact *a = artifact_load(A.dir, &e);
  /* before any library of the artifact is loaded: every file as compiled,
   * and native code of the .hpd file's own only by consent */
  if (a && artifact_check_files(a, A.allow_native, &e) < 0) {
    artifact_free(a);
    a = NULL;
  }
  if (a && A.detect_anomaly) {
    if (a->target && !strcmp(a->target, "cuda")) {
      rt_fail(&e, "--detect-anomaly runs the reference executor on the CPU, which a --target cuda artifact has not: run the CPU "
                  "artifact of the same job (hpdlc compile without --target cuda)");
      artifact_free(a);
      a = NULL;
    } else { /* read by the program when it loads (program_exec.c), in every rank */
      setenv("HPDL_EXECUTOR", "interp", 1);
      setenv("HPDL_DETECT_ANOMALY", "1", 1);
    }
  }
  if (!a) {
    if (rank == 0) rank_error(e.msg);
    return 1;
  }
  if (!launched) {
    int np = A.np ? A.np : a->world_size;
    if (np != a->world_size) {
      fprintf(stderr,
              "hpdlrun: error: -np %d, but %s was compiled for %d rank%s (dp=%d tp=%d pp=%d cp=%d)\n"
              "hint: run with -np %d, or recompile with the layout you want (hpdlc compile --dp/--tp/--pp)\n",
              np, A.dir, a->world_size, a->world_size == 1 ? "" : "s", a->layout.dp, a->layout.tp, a->layout.pp, a->layout.cp,
              a->world_size);
      artifact_free(a);
      return 2;
    }
    if (np > 1 || A.mpirun) {
#ifndef HPDL_HAVE_MPI
      fprintf(stderr, "hpdlrun: error: this hpdlrun was built without MPI: only one-rank jobs run\n");
      artifact_free(a);
      return 1;
#else
      artifact_free(a);
      return launch(argc, argv, np);
#endif
    }
  }
  Comm *comm = NULL;
  if (launched) {
#ifdef HPDL_HAVE_MPI
    comm = comm_mpi_new(&a->layout, &e);
#else
    rt_fail(&e, "this hpdlrun was built without MPI, but runs under a launcher");
#endif
  } else {
    comm = comm_local_new(&e);
  }
  if (!comm) {
    if (rank == 0) rank_error(e.msg);
    fflush(stderr);
#ifdef HPDL_HAVE_MPI
    /* Finalising waits for every rank, so rank 0's message is out before
     * mpirun sees a rank fail and stops the others. */
    if (launched) comm_mpi_finalize();
#endif
    artifact_free(a);
    return 1;
  }
  /* before the program (and its BLAS) is loaded, which reads the choice */
  CoresChoice cores = cores_choose(A.threads, comm->node_ranks);
  cores_apply(&cores);
  char threads[64];
  cores_describe(&cores, threads, sizeof threads);
  A.t.threads = threads;
  A.t.nthreads = cores.threads;
  const char *tty = getenv("HPDL_TTY");
  A.t.tty = tty ? !strcmp(tty, "1") : isatty(STDOUT_FILENO);
  TrainSummary sum;
  int reporter = 0;
  rc = train_run(a, comm, &A.t, &sum, &reporter, &e);
  if (rc < 0) {
    if (reporter) rank_error(e.msg);
  } else if (comm->world_rank == 0 && A.t.progress != TRAIN_PROGRESS_QUIET) {
    if (sum.last_step == sum.first_step) {
      printf("hpdlrun: nothing to do: the run is at step %" PRId64 " of %" PRId64 "\n", sum.first_step, sum.total_steps);
    } else {
      printf("hpdlrun: done: steps %" PRId64 "..%" PRId64 " in %.2f s, loss %.4f -> %.4f, %.0f %s/s", sum.first_step + 1,
             sum.last_step, sum.seconds, sum.first_loss, sum.last_loss, sum.tokens_per_s, a->image_rank > 0 ? "images" : "tokens");
      if (sum.last_checkpoint[0]) printf(", checkpoint %s", sum.last_checkpoint);
      printf("\n");
    }
  }
  fflush(stdout);
  comm_destroy(comm);
  artifact_free(a);
  if (rc < 0) return 1;
  /* stopped by a signal: 128 + it, as a killed process would exit, unless
   * hpdlrun's launcher passed it on and says so itself */
  return sum.stop_status && !sum.stop_via_launcher ? sum.stop_status : 0;
}
