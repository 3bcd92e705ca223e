/* main.c - the hpdlc driver: reads the command line and runs the phases. */
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "progress.h"
#include "arena.h"
#include "ast.h"
#include "autodiff.h"
#include "compile.h"
#include "diag.h"
#include "emit.h"
#include "fbsplit.h"
#include "fuse.h"
#include "ir.h"
#include "loader.h"
#include "lower.h"
#include "moepack.h"
#include "memplan.h"
#include "pipeline.h"
#include "plan.h"
#include "catalog_cmd.h"
#include "report.h"
#include "schedule.h"
#include "spmd.h"
#include "dpsync.h"
#include "sema.h"
#include "sim.h"

/* Flags that override the parallel / train blocks: flag, block.key, what it takes. */
typedef struct {
  const char *flag;
  const char *key;
  const char *arg;
} LayoutFlag;

static const LayoutFlag layout_flags[] = {
    {"--dp", "parallel.data", "N|auto"},
    {"--tp", "parallel.tensor", "N|auto"},
    {"--pp", "parallel.pipeline", "N|auto"},
    {"--cp", "parallel.context", "N|auto"},
    {"--ep", "parallel.expert", "N|auto"},
    {"--etp", "parallel.expert_tensor", "N|auto"},
    {"--sp", "parallel.sequence", "on|off|auto"},
    {"--zero", "parallel.zero", "0-3|auto"},
    {"--micro-batch", "train.micro_batch", "N"},
    {"--global-batch", "train.batch", "N"},
    {"--precision", "train.precision", "fp32|bf16|fp16|fp8|mxfp8|nvfp4"},
    {"--moments", "train.moments", "fp32|bf16"},
    {"--fp8-scaling", "train.fp8_scaling", "delayed|current"},
    {"--recompute", "parallel.recompute", "none|selective|full|ops|act|auto"},
    {"--schedule", "parallel.schedule", "gpipe|1f1b|interleaved|auto"},
    {"--virtual-stages", "parallel.virtual", "N|auto"},
    {"--balance", "parallel.balance", "cost|layers|ends"},
    {"--dispatcher", "parallel.dispatcher", "alltoall|deepep"},
    {"--cp-comm", "parallel.cp_comm", "allgather|ring|auto"},
    {"--engine", "parallel.engine", "hpdl|deepspeed"},
    {"--overlap", "parallel.overlap", "on|off"},
    {"--tp-overlap", "parallel.tp_overlap", "on|off"},
    {"--vocab-pad", "parallel.vocab_pad", "N"},
    {"--recompute-layers", "parallel.recompute_layers", "N"},
    {"--fused-ce", "parallel.fused_ce", "on|off|auto"},
    {"--compression", "parallel.compression", "none|fp16|bf16|int8|topk"},
    {"--gpus", "parallel.gpus", "N"},
    {"--gpus-per-node", "parallel.gpus_per_node", "N"},
    {"--nodes", "parallel.nodes", "N|auto"},
    {"--cluster", "parallel.cluster", "NAME|FILE.hpd"},
};
enum { NLAYOUT_FLAGS = sizeof layout_flags / sizeof layout_flags[0] };

typedef struct {
  const char *verb;
  const char *stage; /* emit */
  int pipe_stage;    /* emit cuda: --stage N, the pipeline chunk */
  const char **files;
  int nfiles;
  SemDefine defines[64];
  int ndefines;
  SemDefine layout[NLAYOUT_FLAGS * 2];
  int nlayout;
  const char *model;
  int quiet;
  int color; /* -1 auto */
  PlanCliOptions plan; /* plan: --format, -o, --trace, --scaling, --search, --top */
  CompileOptions compile; /* compile: -o, --target, --executor */
} Cli;

static const char *const verbs[] = {"check", "emit", "plan", "compile", "report", "catalog"};

/* --cluster FILE.hpd: the file (a cluster declaration, as hpdlc plan
 * --calibrate writes one) joins the program, and --cluster names its
 * cluster. 0, or -1 after a message. */
static int add_cluster_file(Arena *arena, Diag *diag, Cli *cli, LoadedProgram *prog) {
  SemDefine *d = NULL;
  for (int j = 0; j < cli->nlayout; j++)
    if (!strcmp(cli->layout[j].flag, "--cluster")) d = &cli->layout[j];
  /* the flag's own value (argv), kept: each model file rewrites the define */
  static const char *path;
  if (!d) return 0;
  if (!path) {
    size_t n = strlen(d->value);
    if (n < 4 || strcmp(d->value + n - 4, ".hpd")) return 0;
    path = d->value;
  }
  int before = diag_error_count(diag);
  LoadedProgram extra = load_program(arena, diag, path);
  if (diag_error_count(diag) != before || extra.nfiles == 0) return -1;
  const AstDecl *found = NULL;
  int count = 0;
  for (int i = 0; i < extra.files[0]->ndecls; i++)
    if (extra.files[0]->decls[i]->kind == DECL_CLUSTER) found = extra.files[0]->decls[i], count++;
  if (count != 1) {
    fprintf(stderr, "hpdlc: --cluster %s: the file declares %d clusters; --cluster FILE.hpd takes a file with exactly one "
                    "(or name one of them: --cluster NAME with the file imported)\n",
            path, count);
    return -1;
  }
  AstFile **all = arena_alloc(arena, sizeof(AstFile *) * (size_t)(prog->nfiles + extra.nfiles));
  memcpy(all, prog->files, sizeof(AstFile *) * (size_t)prog->nfiles);
  memcpy(all + prog->nfiles, extra.files, sizeof(AstFile *) * (size_t)extra.nfiles);
  prog->files = all;
  prog->nfiles += extra.nfiles;
  d->value = found->name.name;
  return 0;
}
static const char *const stages[] = {"ast", "source", "ir", "grad", "fused", "spmd", "dp", "memory", "schedule", "stash", "cuda"};

static void help_common_options(void) {
  puts("options:\n"
       "  -D NAME=VALUE          override a model parameter (repeatable)\n"
       "  --model NAME           the model to use when the file declares several\n"
       "  -q, --quiet            print nothing on success\n"
       "  --allow-native         let compile load the libraries of `extern` functions\n"
       "                         (native code; check, plan and emit never load them)\n"
       "  --color WHEN           color diagnostics: auto, always or never\n"
       "  --help                 show this help\n"
       "\n"
       "layout overrides (each replaces the parallel or train block's setting):");
  for (int i = 0; i < NLAYOUT_FLAGS; i++) {
    char left[48];
    snprintf(left, sizeof left, "%s %s", layout_flags[i].flag, layout_flags[i].arg);
    printf("  %-32s %s\n", left, layout_flags[i].key);
  }
  puts("\n--cluster takes a cluster of the catalog (hpdlc catalog lists them) or a cluster file,\n"
       "which may also describe a device the catalog lacks (docs/catalog.md).");
}

static void help_main(void) {
  puts("usage: hpdlc <command> [options] FILE...\n"
       "\n"
       "hpdlc checks, plans and compiles .hpd programs: a neural network, its\n"
       "training and its parallel layout in one file.\n"
       "\n"
       "commands:\n"
       "  check FILE...          check files and report every error\n"
       "  emit ast FILE          print the syntax tree\n"
       "  emit source FILE       print the file in canonical form\n"
       "  emit ir FILE           print the tensor IR of the model\n"
       "  emit grad FILE         print its backward graphs (autodiff)\n"
       "  emit fused FILE        print the IR grouped into kernels (fusion)\n"
       "  emit memory FILE       print the static memory plan of a rank's training step\n"
       "  emit spmd FILE         print the program one rank runs under the layout\n"
       "  emit dp FILE           print the data-parallel gradient synchronisation (ZeRO)\n"
       "  emit schedule FILE     print the pipeline schedule: each rank's instructions\n"
       "\n"
       "  plan FILE              plan the training job: memory per GPU, communication,\n"
       "                         step time, MFU and the limit, before launch; --search\n"
       "                         ranks every layout, --scaling tabulates speed-ups\n"
       "\n"
       "  compile FILE -o DIR    compile the training job into the artifact hpdlrun\n"
       "                         runs: native CPU kernels (--target cpu, the default)\n"
       "                         or CUDA kernels through NVRTC (--target cuda)\n"
       "\n"
       "  report METRICS.jsonl... -o FILE.html|FILE.svg\n"
       "                         charts of hpdlrun --metrics files: loss, learning\n"
       "                         rate, gradient norm, tokens/s; several runs overlaid\n"
       "\n"
       "  catalog [NAME...]      the devices and clusters plan knows, with their figures;\n"
       "                         NAMEs shown in full (--format json)\n"
       "\n"
       "  hpdlc <command> --help shows the options of a command.\n"
       "  hpdlc --version        shows the version.\n"
       "\n"
       "exit status: 0 success, 1 errors in the input, 2 a bad command line.");
}

static void help_verb(const char *verb) {
  if (!strcmp(verb, "plan")) {
    puts("usage: hpdlc plan [options] FILE\n"
         "\n"
         "Prices the partitioned training program of FILE on its cluster without\n"
         "running it: memory per GPU (weights, gradients, optimizer state by ZeRO\n"
         "stage, activations for the micro-batches in flight, temporaries, buffers),\n"
         "communication per GPU per step, the pipeline bubble from the schedule, the\n"
         "step time, tokens/s, TFLOP/s per GPU, MFU, and the limiting resource. Settings\n"
         "left `auto` are chosen by the planner. Formulas: docs/planner.md.\n"
         "\n"
         "plan options:\n"
         "  --format text|json|html  the report (json: the stable schema of docs/planner.md)\n"
         "  -o FILE                  write the report to FILE\n"
         "  --trace FILE             a Chrome trace of one predicted step (Perfetto)\n"
         "  --search                 rank every layout for the GPU count that fits\n"
         "  --top K                  how many layouts --search shows (5)\n"
         "  --scaling LIST           strong and weak scaling at these GPU counts (8,16,32)\n"
         "  --attention flash|flash1|flash2|flash3|materialized\n"
         "                           how attention is priced: a tiled flash attention\n"
         "                           (flash, the default); flash1, flash2, flash3: that\n"
         "                           FlashAttention generation, at least its FLOPs at its\n"
         "                           published share of the peak (docs/planner.md 9.1);\n"
         "                           materialized: scores stored in memory (Megatron-LM\n"
         "                           2021), to compare with such runs\n"
         "  --fusion on|off          on (default): the CUDA back end's fused kernels; off:\n"
         "                           every elementwise op and reduction a kernel of its own,\n"
         "                           as PyTorch's eager mode runs (docs/planner.md 9.7)\n"
         "  --explain                the five largest terms of the step time, with sources\n"
         "  --evidence               every published run like the plan, closest first, with\n"
         "                           the planner's error on it (the report gives the three\n"
         "                           closest; docs/planner.md 16.1)\n"
         "  --compare TRACE          an hpdlrun --profile trace's measured time per op class\n"
         "                           (GEMM, memory-bound, each collective, bubble, optimizer,\n"
         "                           data, other, the step) beside the plan's, with the error\n"
         "  --calibrate TRACE -o FILE.hpd\n"
         "                           fit the cluster's device (FLOP/s, memory bandwidth) and\n"
         "                           links to what the trace measured, and write them as a\n"
         "                           cluster file: then plan with --cluster FILE.hpd\n"
         "  --progress auto|tty|plain|quiet\n"
         "                           --search's progress on stderr: auto (default) a line\n"
         "                           redrawn on a terminal once it takes 0.5 s, nothing\n"
         "                           elsewhere; plain: a line a phase\n"
         "  --measure-cpu            time this machine (OpenBLAS sgemm, the bf16 GEMM,\n"
         "                           memory triad) and plan the `cpu` device with what\n"
         "                           it reaches\n");
    help_common_options();
    return;
  }
  if (!strcmp(verb, "compile")) {
    puts("usage: hpdlc compile [options] FILE [--target cpu|cuda] -o DIR\n"
         "\n"
         "Compiles the training job of FILE under its layout into the artifact folder\n"
         "DIR, which `hpdlrun DIR` runs: the model lowered at the train block's micro\n"
         "batch, partitioned over tensor, sequence and context parallelism, split into\n"
         "one chunk per pipeline stage, differentiated (the recompute policy applies),\n"
         "memory-planned, and with the CPU back end, compiled to native kernels.\n"
         "DIR holds manifest.json, program.so and per stage its chunk (stageS.hir)\n"
         "and kernels (stageS.so); nothing else is needed at run time. docs/runtime.md\n"
         "describes the files.\n"
         "\n"
         "compile options:\n"
         "  -o DIR                   the artifact folder (made when missing)\n"
         "  --target cpu|cuda        what to compile for (cpu, the default; cuda: CUDA C\n"
         "                           compiled by NVRTC into stageS.cubin / .ptx, with\n"
         "                           stageS.kernels.json; hpdlrun runs it on each rank's\n"
         "                           GPU; NVRTC's output is cached in $HPDL_CACHE, else\n"
         "                           ~/.cache/hpdl/nvrtc, up to $HPDL_CACHE_SIZE, 2048M)\n"
         "  --arch sm_80|sm_90|...   the GPU architecture of --target cuda (sm_80)\n"
         "  --emulate                cuda: also build stageS.emu.so (the kernels as C++\n"
         "                           through kernels/cuda_emu.h, with $HPDL_CXX or c++)\n"
         "                           for hpdlrun --device emulate on a machine without GPU\n"
         "                           (kept in the same cache)\n"
         "  --attention flash|materialized\n"
         "                           attention(q, k, v) as one flash-attention kernel that\n"
         "                           never stores the scores (default), or as q k^T,\n"
         "                           softmax and times v with the scores in memory\n"
         "  --fusion on|off          on (default): elementwise ops and reductions fused\n"
         "                           into kernels, epilogues into GEMMs; off: a kernel an\n"
         "                           op (the same numbers, bit for bit: for bisecting a\n"
         "                           kernel, or timing what fusion saves)\n"
         "  --experts grouped|slots  a dropless mixture-of-experts layer (drop = false)\n"
         "                           over the rows routed to each expert (grouped GEMMs,\n"
         "                           the default where expert parallelism is 1) or over\n"
         "                           room for every token in every expert (slots: E / top_k\n"
         "                           times the work; the form expert parallelism exchanges)\n"
         "  -v, --verbose            cuda: each kernel's registers, shared memory,\n"
         "                           spills and launch shape\n"
         "  --executor auto|native|interp\n"
         "                           native: generated kernels (fp32); interp: the\n"
         "                           reference executor (fp64, slow, exact); auto (default):\n"
         "                           native when the CPU back end is built and compiles it\n"
         "  --progress auto|tty|plain|quiet\n"
         "                           progress on stderr: auto (default) a line redrawn on\n"
         "                           a terminal once the compile takes 0.5 s, nothing\n"
         "                           elsewhere; tty: always redrawn; plain: a line a phase\n");
  } else if (!strcmp(verb, "check")) {
    puts("usage: hpdlc check [options] FILE...\n"
         "\n"
         "Parses each file and its imports, checks names, types and shapes of the\n"
         "model, and checks that the parallel layout divides the model and the\n"
         "cluster; a layout with tensor, context, sequence or expert parallelism is\n"
         "partitioned as compile would (its refusals, e.g. a padded vocabulary whose\n"
         "logits reach a softmax). Prints every error of a phase, then stops. On\n"
         "success prints a one-line summary per file.\n");
  } else {
    puts("usage: hpdlc emit ast|source|ir|grad|fused|spmd|dp|memory|schedule|stash|cuda [options] FILE\n"
         "\n"
         "  ast      the syntax tree with source spans\n"
         "  source   the file in canonical form (parse -> print -> parse is stable)\n"
         "  ir       the tensor IR of the model at the train block's micro batch\n"
         "  grad     the graphs of a training step: forward + backward, and per repeated\n"
         "           block its forward (saving activations) and backward; the recompute\n"
         "           policy is the parallel block's or --recompute (auto: none)\n"
         "  fused    the forward IR grouped into kernels, with each kernel's FLOPs and bytes\n"
         "  memory   the memory plan of pipeline chunk 0's rank under the layout: per graph of\n"
         "           its training step, every buffer's bytes, arena offset and live steps, views,\n"
         "           in-place reuse, call workspaces and stashes; then parameters, gradients,\n"
         "           optimizer state and the peak (recompute: as for grad)\n"
         "  spmd     the program a rank runs under the layout (--tp --cp --sp --pp\n"
         "           --virtual-stages): local shapes, sharded parameters, collectives\n"
         "  dp       per pipeline chunk, the gradient synchronisation over the data-parallel\n"
         "           group (--dp --zero, and the layout of spmd): all-reduce (zero 0/1) or\n"
         "           reduce-scatter (2) once per step, and with zero 3 the chunk's program with\n"
         "           its parameters in dp pieces, all-gathered where they are used\n"
         "  schedule each pipeline rank's instructions for one step (--schedule --pp\n"
         "           --virtual-stages; micro-batches = global batch / (dp x micro batch))\n"
         "  stash    each pipeline chunk's training step cut into its forward and backward\n"
         "           parts, and what a micro-batch keeps from one to the other (its stash)\n"
         "  cuda     the CUDA C of pipeline stage --stage N's training step (default 0)\n"
         "           under the layout: a kernel per fused loop, row, copy, fill and\n"
         "           special kernel; GEMMs (for cuBLASLt) as comments\n"
         "\n"
         "  --fusion off   fused, memory, cuda: a kernel an op, as compile --fusion off\n");
  }
  help_common_options();
}

static int cli_error(const char *fmt, const char *a, const char *b) __attribute__((format(printf, 1, 0)));
static int cli_error(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "hpdlc: ");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  if (b) fprintf(stderr, fmt, a, b);
  else fprintf(stderr, fmt, a);
#pragma GCC diagnostic pop
  fprintf(stderr, "\nTry 'hpdlc --help'.\n");
  return 2;
}

/* An option's value from the next argument, unless that is another option
 * (`--gpus --tp 2`: "--gpus needs a value", not "--tp" read as the count
 * and "2" as a file); NULL then, or at the end. */
static const char *next_value(int argc, char **argv, int *i) {
  if (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2)) return NULL;
  return argv[++*i];
}

/* Parses argv; returns 0 to go on, or an exit status. */
static int parse_cli(int argc, char **argv, Cli *cli) {
  memset(cli, 0, sizeof *cli);
  cli->color = -1;
  if (argc < 2) {
    help_main();
    return 2;
  }
  const char *verb = argv[1];
  if (!strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help")) {
    help_main();
    return -1;
  }
  if (!strcmp(verb, "--version")) {
    printf("hpdlc %s\n", HPDL_VERSION);
    return -1;
  }
  int known = 0;
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) known |= !strcmp(verbs[i], verb);
  if (!known) {
    const char *close = diag_closest(verb, verbs, (int)(sizeof verbs / sizeof verbs[0]));
    if (close) return cli_error("unknown command '%s'; did you mean '%s'?", verb, close);
    return cli_error("unknown command '%s'", verb, NULL);
  }
  cli->verb = verb;
  cli->files = calloc((size_t)argc, sizeof(char *));
  int i = 2;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      help_verb(verb);
      return -1;
    }
    if (!strcmp(a, "--")) {
      for (i++; i < argc; i++) cli->files[cli->nfiles++] = argv[i];
      break;
    }
    if (a[0] != '-' || a[1] == '\0') {
      if (!strcmp(verb, "emit") && !cli->stage) {
        int ok = 0;
        for (size_t k = 0; k < sizeof stages / sizeof stages[0]; k++) ok |= !strcmp(stages[k], a);
        if (!ok) return cli_error("emit: unknown stage '%s'; stages are ast, source, ir, grad, fused, spmd, dp, memory, schedule, stash and cuda", a, NULL);
        cli->stage = a;
        continue;
      }
      cli->files[cli->nfiles++] = a;
      continue;
    }
    if (!strcmp(verb, "compile")) { /* -o DIR, --target T, --executor E (also --flag=VALUE) */
      size_t fl = strchr(a, '=') ? (size_t)(strchr(a, '=') - a) : strlen(a);
      int which = !strcmp(a, "-o") ? 0 : (fl == 8 && !strncmp(a, "--target", 8)) ? 1 : (fl == 10 && !strncmp(a, "--executor", 10)) ? 2
                  : (fl == 6 && !strncmp(a, "--arch", 6)) ? 3 : (fl == 11 && !strncmp(a, "--attention", 11)) ? 4
                  : (fl == 9 && !strncmp(a, "--experts", 9)) ? 5 : -1;
      if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
        cli->compile.verbose = 1;
        continue;
      }
      if (!strcmp(a, "--emulate")) {
        cli->compile.emulate = 1;
        continue;
      }
      if (which >= 0) {
        static const char *const flag[] = {"-o", "--target", "--executor", "--arch", "--attention", "--experts"};
        const char *v = a[fl] == '=' ? a + fl + 1 : next_value(argc, argv, &i);
        if (!v || !*v) return cli_error("%s needs a value", flag[which], NULL);
        if (which == 0) cli->compile.out_dir = v;
        else if (which == 1) cli->compile.target = v;
        else if (which == 3) {
          if (strncmp(v, "sm_", 3) || v[3] < '1' || v[3] > '9') return cli_error("--arch takes a GPU architecture such as sm_80, sm_90 or sm_100, not '%s'", v, NULL);
          cli->compile.arch = v;
        } else if (which == 4) {
          if (strcmp(v, "flash") && strcmp(v, "materialized"))
            return cli_error("--attention takes flash or materialized, not '%s'", v, NULL);
          cli->compile.materialize_attention = !strcmp(v, "materialized");
        } else if (which == 5) {
          if (strcmp(v, "grouped") && strcmp(v, "slots")) return cli_error("--experts takes grouped or slots, not '%s'", v, NULL);
          cli->compile.expert_slots = !strcmp(v, "slots");
        }
        else if (compile_executor_parse(v) < 0) return cli_error("--executor takes auto, native or interp, not '%s'", v, NULL);
        else cli->compile.executor = (CompileExecutor)compile_executor_parse(v);
        continue;
      }
    }
    if (!strcmp(verb, "emit") && (!strcmp(a, "--stage") || !strncmp(a, "--stage=", 8))) {
      const char *v = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : NULL);
      char *end = NULL;
      long n = v ? strtol(v, &end, 10) : -1;
      if (!v || !*v || *end || n < 0 || n > 100000) return cli_error("--stage takes a pipeline stage number (0, 1, ...), not '%s'", v ? v : "", NULL);
      cli->pipe_stage = (int)n;
      continue;
    }
    if (!strcmp(verb, "plan") && !strcmp(a, "-o")) {
      if (!(cli->plan.output = next_value(argc, argv, &i))) return cli_error("-o needs a file name%s", "", NULL);
      continue;
    }
    /* -D NAME=VALUE or -DNAME=VALUE */
    if (!strncmp(a, "-D", 2)) {
      const char *def = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
      if (!def) return cli_error("-D needs NAME=VALUE", "", NULL);
      const char *eq = strchr(def, '=');
      if (!eq || eq == def || !eq[1]) return cli_error("-D %s: expected NAME=VALUE", def, NULL);
      if (cli->ndefines == 64) return cli_error("too many -D options%s", "", NULL);
      cli->defines[cli->ndefines].name = strndup(def, (size_t)(eq - def));
      cli->defines[cli->ndefines].value = eq + 1;
      cli->ndefines++;
      continue;
    }
    if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
      cli->quiet = 1;
      continue;
    }
    if (!strcmp(a, "--allow-native")) { /* every verb takes it; only compile loads a library */
      cli->compile.allow_native = 1;
      continue;
    }
    /* --flag VALUE or --flag=VALUE */
    const char *eq = strchr(a, '=');
    size_t flen = eq ? (size_t)(eq - a) : strlen(a);
    const char *value = eq ? eq + 1 : NULL;
    if (!strncmp(a, "--model", flen) && flen == 7) {
      value = value ? value : next_value(argc, argv, &i);
      if (!value || !*value) return cli_error("--model needs a name%s", "", NULL);
      cli->model = value;
      continue;
    }
    if (!strncmp(a, "--progress", flen) && flen == 10 && (!strcmp(verb, "compile") || !strcmp(verb, "plan"))) {
      value = value ? value : (i + 1 < argc ? argv[++i] : NULL);
      int mode = value ? progress_mode_parse(value) : -1;
      if (mode < 0) return cli_error("--progress takes auto, tty, plain or quiet, not '%s'", value ? value : "", NULL);
      cli->compile.progress = (ProgressMode)mode;
      cli->plan.progress = mode;
      continue;
    }
    if (!strncmp(a, "--fusion", flen) && flen == 8 && (!strcmp(verb, "compile") || !strcmp(verb, "plan") || !strcmp(verb, "emit"))) {
      value = value ? value : (i + 1 < argc ? argv[++i] : NULL);
      if (!value || (strcmp(value, "on") && strcmp(value, "off")))
        return cli_error("--fusion takes on or off, not '%s'", value ? value : "", NULL);
      int off = !strcmp(value, "off");
      cli->compile.fusion_off = off;
      cli->plan.fusion_off = off; /* emit reads compile's: it prints what compile builds */
      continue;
    }
    if (!strncmp(a, "--color", flen) && flen == 7) {
      value = value ? value : (i + 1 < argc ? argv[++i] : NULL);
      if (!value || (strcmp(value, "auto") && strcmp(value, "always") && strcmp(value, "never")))
        return cli_error("--color takes auto, always or never%s", "", NULL);
      cli->color = !strcmp(value, "auto") ? -1 : !strcmp(value, "always");
      continue;
    }
    if (!strcmp(verb, "plan")) {
      static const char *const pflags[] = {"--format", "--trace",       "--scaling",   "--top",     "--search",
                                           "--output", "--measure-cpu", "--attention", "--explain", "--compare",
                                           "--calibrate", "--evidence"};
      int which = -1;
      for (int k = 0; k < 12; k++)
        if (strlen(pflags[k]) == flen && !strncmp(pflags[k], a, flen)) which = k;
      if (which == 8) {
        if (value) return cli_error("--explain takes no value%s", "", NULL);
        cli->plan.explain = 1;
        continue;
      }
      if (which == 11) {
        if (value) return cli_error("--evidence takes no value%s", "", NULL);
        cli->plan.evidence = 1;
        continue;
      }
      if (which == 6) {
        if (value) return cli_error("--measure-cpu takes no value%s", "", NULL);
        cli->plan.measure_cpu = 1;
        continue;
      }
      if (which == 4) {
        if (value) return cli_error("--search takes no value%s", "", NULL);
        cli->plan.search = 1;
        continue;
      }
      if (which >= 0) {
        value = value ? value : next_value(argc, argv, &i);
        if (!value || !*value) return cli_error("%s needs a value", pflags[which], NULL);
        if (which == 0) {
          if (strcmp(value, "text") && strcmp(value, "json") && strcmp(value, "html"))
            return cli_error("--format takes text, json or html, not '%s'", value, NULL);
          cli->plan.format = value;
        } else if (which == 7) {
          int kernel = cost_attn_kernel_from_name(value);
          if (kernel < 0 && strcmp(value, "materialized"))
            return cli_error("--attention takes flash, flash1, flash2, flash3 or materialized, not '%s'", value, NULL);
          cli->plan.materialized = kernel < 0;
          cli->plan.attention_kernel = kernel < 0 ? COST_ATTN_TILED : (CostAttnKernel)kernel;
        } else if (which == 1) cli->plan.trace = value;
        else if (which == 2) cli->plan.scaling = value;
        else if (which == 5) cli->plan.output = value;
        else if (which == 9) cli->plan.compare = value;
        else if (which == 10) cli->plan.calibrate = value;
        else {
          char *end;
          long k = strtol(value, &end, 10);
          if (*end || k < 1 || k > 1000) return cli_error("--top takes a count from 1 to 1000, not '%s'", value, NULL);
          cli->plan.top = (int)k;
        }
        continue;
      }
    }
    const LayoutFlag *lf = NULL;
    for (int k = 0; k < NLAYOUT_FLAGS; k++)
      if (strlen(layout_flags[k].flag) == flen && !strncmp(layout_flags[k].flag, a, flen)) lf = &layout_flags[k];
    if (!lf) {
      const char *names[NLAYOUT_FLAGS + 16];
      int n = 0;
      for (int k = 0; k < NLAYOUT_FLAGS; k++) names[n++] = layout_flags[k].flag;
      if (!strcmp(verb, "plan")) {
        names[n++] = "--format";
        names[n++] = "--trace";
        names[n++] = "--scaling";
        names[n++] = "--search";
        names[n++] = "--top";
        names[n++] = "--attention";
        names[n++] = "--explain";
        names[n++] = "--evidence";
        names[n++] = "--compare";
        names[n++] = "--calibrate";
        names[n++] = "--progress";
        names[n++] = "--fusion";
      }
      if (!strcmp(verb, "compile")) {
        names[n++] = "--target";
        names[n++] = "--executor";
        names[n++] = "--progress";
        names[n++] = "--fusion";
      }
      if (!strcmp(verb, "emit")) names[n++] = "--fusion";
      names[n++] = "--model";
      names[n++] = "--allow-native";
      names[n++] = "--quiet";
      names[n++] = "--color";
      names[n++] = "--help";
      char *flag = strndup(a, flen);
      const char *close = flag ? diag_closest(flag, names, n) : NULL;
      int rc = close ? cli_error("unknown option '%s'; did you mean '%s'?", flag, close)
                     : cli_error("unknown option '%s'", flag ? flag : a, NULL);
      free(flag);
      return rc;
    }
    value = value ? value : next_value(argc, argv, &i);
    if (!value || !*value) return cli_error("%s needs a value (%s)", lf->flag, lf->arg);
    if (!strcmp(lf->flag, "--micro-batch")) cli->plan.mb_fixed = 1;
    cli->layout[cli->nlayout].name = lf->key;
    cli->layout[cli->nlayout].value = value;
    cli->layout[cli->nlayout].flag = lf->flag;
    cli->nlayout++;
  }
  if (!strcmp(verb, "emit")) {
    if (!cli->stage) return cli_error("emit: missing stage (ast or source)%s", "", NULL);
    if (cli->nfiles != 1) return cli_error("emit %s takes exactly one file", cli->stage, NULL);
  }
  if (cli->nfiles == 0) return cli_error("%s: no input file", verb, NULL);
  if (!strcmp(verb, "compile") && cli->nfiles != 1) return cli_error("compile takes exactly one file%s", "", NULL);
  if (!strcmp(verb, "compile") && !cli->compile.out_dir) return cli_error("compile: missing the artifact folder (-o DIR)%s", "", NULL);
  if (!strcmp(verb, "compile") && cli->compile.target && strcmp(cli->compile.target, "cpu") && strcmp(cli->compile.target, "cuda"))
    return cli_error("compile: unknown target '%s' (there are: cpu, cuda)", cli->compile.target, NULL);
  if (!strcmp(verb, "compile") && cli->compile.arch && !(cli->compile.target && !strcmp(cli->compile.target, "cuda")))
    return cli_error("compile: --arch %s applies to --target cuda only", cli->compile.arch, NULL);
  if (cli->compile.emulate && !(cli->compile.target && !strcmp(cli->compile.target, "cuda")))
    return cli_error("compile: --emulate applies to --target cuda only%s", "", NULL);
  return 0;
}

static const char *human_count(char *buf, size_t n, int64_t v) {
  if (v >= 1000000000) snprintf(buf, n, "%.2fB", (double)v / 1e9);
  else if (v >= 1000000) snprintf(buf, n, "%.1fM", (double)v / 1e6);
  else if (v >= 1000) snprintf(buf, n, "%.1fK", (double)v / 1e3);
  else snprintf(buf, n, "%" PRId64, v);
  return buf;
}

/* `check` of a pipeline over a forward without one repeat: the forward must
 * have a place for every stage boundary, where one activation crosses
 * (pipeline.h); with one repeat sema counts its layers. */
static void check_pipeline_cuts(Arena *arena, Diag *diag, const SemModel *m) {
  const SemLayout *L = &m->layout;
  int64_t nstages = (L->pp > 0 ? L->pp : 1) * (L->virtual_stages > 0 ? L->virtual_stages : 1);
  if (nstages <= 1 || m->repeats == 1) return;
  IrModule *ir = lower_model(arena, diag, m, m->train.micro_batch);
  SpmdSpec spec = emit_declared_spec(m);
  IrModule *part = ir ? spmd_partition(arena, diag, ir, &spec) : NULL;
  const PipeUnits *u = part ? pipe_units(arena, part) : NULL;
  if (!u || u->nunits >= nstages) return;
  diag_error(diag, m->model->decl->name.span,
             "pipeline x virtual = %" PRId64 " stages need as many pieces of the forward, but %s's forward cuts into %" PRId64
             " (a cut falls where one activation alone crosses: between blocks, not inside a residual one)",
             nstages, m->model->decl->name.name, u->nunits);
  diag_hint(diag, "use at most %" PRId64 " pipeline stages, or more data parallelism", u->nunits);
}

/* `check` of a layout that partitions the model (tensor, context, sequence
 * or expert parallelism): the partitioner's own refusals (a padded
 * vocabulary whose logits reach a softmax, a shape a group does not
 * divide) with their source lines, as compile and plan would give them. */
static void check_partition(Arena *arena, Diag *diag, const SemModel *m) {
  SpmdSpec spec = emit_declared_spec(m);
  if (spec.tp <= 1 && spec.cp <= 1 && !spec.sp && spec.ep <= 1) return;
  IrModule *ir = lower_model(arena, diag, m, m->train.micro_batch);
  if (!ir) return;
  for (int k = 0; k < ir->ninputs; k++) /* an image model has no sequence to split (compile's feeds) */
    if (ir->inputs[k].dtype == DT_F32 && ir->inputs[k].rank == 4) spec.seq_len = 0;
  spmd_partition(arena, diag, ir, &spec);
}

static void print_summary(const char *path, const SemModel *m) {
  char count[32];
  const SemLayout *L = &m->layout;
  printf("%s: ok: model %s, %s parameters (%" PRId64 ")", path, m->model->decl->name.name,
         human_count(count, sizeof count, sem_param_count(m)), sem_param_count(m));
  int64_t active = sem_active_param_count(m);
  if (active != sem_param_count(m))
    printf(", %s active per token (%" PRId64 ")", human_count(count, sizeof count, active), active);
  printf("; ");
  if (L->dp < 0) printf("dp=auto");
  else printf("dp=%" PRId64, L->dp);
  printf(" tp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64, L->tp, L->pp, L->cp);
  if (L->ep > 1) printf(" ep=%" PRId64, L->ep);
  printf(" on %s (%" PRId64 " device%s)\n", L->cluster_name, L->gpus, L->gpus == 1 ? "" : "s");
}

/* `emit dp`: per pipeline chunk, the data-parallel side of its step under
 * the layout (dpsync.h): the dp.sync graph, and with ZeRO-3 the chunk's
 * module with its parameters in pieces and the step graphs autodiff makes of
 * it (zero 0-2 leave those as `emit spmd` and `emit grad` show them). */
static int emit_dp(Arena *arena, Diag *diag, const char *path, const SemModel *m, const IrModule *ir, int status) {
  const SemLayout *L = &m->layout;
  SimLayout sl = emit_declared_layout(m);
  int64_t dp = sl.dp;
  int zero = L->zero > 0 ? (int)L->zero : 0;
  SpmdSpec spec = emit_declared_spec(m);
  IrModule *part = spmd_partition(arena, diag, ir, &spec);
  int64_t chunks = sl.pp * sl.vpp;
  Recompute policy = sl.recompute;
  const char *split_why = NULL;
  int64_t *split = part ? plan_chunk_layers(arena, m, m->train.micro_batch, spec.tp, spec.cp, spec.sp, policy, chunks, &split_why) : NULL;
  if (part && !split) {
    fprintf(stderr, "hpdlc: %s: the pipeline stages cannot be split: %s\n", path, split_why);
    return 1;
  }
  PipeResult *pr = split ? pipe_split(arena, diag, part, chunks, split) : NULL;
  if (!pr) return 1;
  printf("# data-parallel step: dp=%" PRId64 " zero=%d; tp=%" PRId64 " cp=%" PRId64 " sp=%s, %d pipeline chunk%s, recompute %s\n", dp,
         zero, spec.tp, spec.cp, spec.sp ? "on" : "off", pr->nchunks, pr->nchunks == 1 ? "" : "s", sem_recompute_name(policy));
  for (int c = 0; c < pr->nchunks; c++) {
    IrModule *cm = pipe_chunk_module(arena, pr, c);
    if (zero == 3 && !(cm = dpsync_shard_params(arena, diag, cm, dp, sl.ep))) return 3;
    printf("# chunk %d\n", c);
    if (zero == 3) ir_print(cm, stdout);
    const char *why = NULL;
    AdResult *ad = ad_build_layers(cm, policy, m->layout.recompute_layers, &why);
    DpSync *sync = ad ? dpsync_build(ad, dp, zero, sl.ep, &why) : NULL;
    if (!sync) {
      fprintf(stderr, "hpdlc: %s: chunk %d: %s\n", path, c, why ? why : "?");
      return 1;
    }
    if (ir_verify(cm, stderr)) {
      fprintf(stderr, "hpdlc: internal error: chunk %d's data-parallel step does not verify\n", c);
      status = 3;
    }
    if (zero == 3) {
      /* the step graphs, without dp.sync (printed below) */
      int keep = cm->ngraphs;
      cm->ngraphs = sync->graph;
      ad_print(ad, stdout);
      cm->ngraphs = keep;
    }
    dpsync_print(sync, stdout);
  }
  return status;
}

/* `emit memory`: the plan of the program pipeline chunk 0's ranks run, built
 * as the simulator builds it (memplan.h); returns the exit status. */
static int emit_memory(Arena *arena, Diag *diag, const char *path, const SemModel *m, int fusion, int status) {
  SimLayout sl = emit_declared_layout(m);
  const char *why = NULL;
  SimRankProgram *rp = sim_rank_program(arena, diag, m, &sl, 0, NULL, &why);
  if (!rp) {
    fprintf(stderr, "hpdlc: %s: no memory plan: %s\n", path, why);
    return 1;
  }
  MemOptions mo;
  mem_options_from_model(m, &mo);
  mo.entry = rp->ad->step;
  mo.grad_into_slots = 1; /* the CPU target's plan, as hpdlc compile makes it */
  mo.fusion = fuse_module_opts(arena, rp->module, fuse_options(0, fusion));
  if (fuse_check(mo.fusion, stderr)) { /* still print the plan of the IR values */
    fprintf(stderr, "hpdlc: internal error: the fusion does not check; the plan is printed without it\n");
    mo.fusion = NULL;
    status = 3;
  }
  MemPlan *plan = mem_plan_module(arena, rp->module, &mo);
  if (!plan) {
    fprintf(stderr, "hpdlc: internal error: %s: the program cannot be planned (a call cycle or a missing graph)\n",
            path);
    return 3;
  }
  if (mem_check(plan, stderr)) {
    fprintf(stderr, "hpdlc: internal error: the memory plan does not check\n");
    status = 3;
  }
  printf("# memory plan: chunk 0 of %d, tp=%" PRId64 " cp=%" PRId64 " sp=%s, micro batch %" PRId64
         ", recompute %s\n",
         rp->nchunks, sl.tp, sl.cp, sl.sp ? "on" : "off", sl.micro_batch, sem_recompute_name(sl.recompute));
  mem_print(stdout, plan);
  return status;
}

int main(int argc, char **argv) {
#ifdef __GLIBC__
  /* The compiler's arenas come and go by the thousand (plan --search prices
   * each program in one): keep freed memory in the process rather than
   * hand it back to the kernel and fault it in again (a quarter of the
   * search's time went to page faults) */
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  mallopt(M_TOP_PAD, 16 << 20);
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
#endif
  /* report reads metrics files, not .hpd: its own command line */
  if (argc >= 2 && !strcmp(argv[1], "report")) return report_main(argc - 1, argv + 1);
  /* catalog reads no file: its own command line too */
  if (argc >= 2 && !strcmp(argv[1], "catalog")) return catalog_main(argc - 1, argv + 1);
  Cli cli;
  int rc = parse_cli(argc, argv, &cli);
  if (rc) { /* a bad option after -D NAME=VALUE: the names it kept go too */
    for (int i = 0; i < cli.ndefines; i++) free((char *)cli.defines[i].name);
    free(cli.files);
    return rc < 0 ? 0 : rc;
  }
  Diag *diag = diag_new(stderr);
  diag_set_color(diag, cli.color < 0 ? isatty(2) : cli.color);
  int status = 0;
  for (int i = 0; i < cli.nfiles; i++) {
    Arena *arena = arena_new();
    int before = diag_error_count(diag);
    LoadedProgram prog = load_program(arena, diag, cli.files[i]);
    if (diag_error_count(diag) == before && prog.nfiles > 0 && add_cluster_file(arena, diag, &cli, &prog) < 0) {
      status = 1;
      arena_free(arena);
      continue;
    }
    if (diag_error_count(diag) == before && prog.nfiles > 0) {
      if (cli.stage && !strcmp(cli.stage, "ast")) ast_dump_file(stdout, prog.files[0]);
      else if (cli.stage && !strcmp(cli.stage, "source")) ast_print_file(stdout, prog.files[0]);
      else if (cli.stage) {
        int bad_cli = 0;
        SemOptions opts = {cli.defines, cli.ndefines, cli.layout, cli.nlayout, cli.model, &bad_cli};
        SemModel *m = sema_check(arena, diag, &prog, &opts);
        if (bad_cli) status = 2;
        IrModule *ir = m ? lower_model(arena, diag, m, m->train.micro_batch) : NULL;
        /* past the IR as written, what compile runs: dropless experts over their rows, or expert-major slots (moepack.h) */
        const char *fold_why = NULL;
        if (ir && strcmp(cli.stage, "ir") &&
            moe_as_compiled(ir, m->layout.ep, m->layout.ep_fold ? m->layout.tp : 1, m->layout.cp, 0, &fold_why) < 0) {
          fprintf(stderr, "hpdlc: expert_tensor = 1 cannot split a mixture-of-experts layer: %s\n", fold_why);
          ir = NULL;
          status = 1;
        }
        if (ir) {
          if (ir_verify(ir, stderr)) {
            fprintf(stderr, "hpdlc: internal error: the IR does not verify\n");
            status = 3;
          }
          if (!strcmp(cli.stage, "grad")) {
            Recompute policy = m->layout.recompute < 0 ? RECOMPUTE_NONE : (Recompute)m->layout.recompute;
            const char *why = NULL;
            AdResult *ad = ad_build_layers(ir, policy, m->layout.recompute_layers, &why);
            if (!ad) {
              fprintf(stderr, "hpdlc: %s: cannot differentiate the model: %s\n", cli.files[i], why);
              status = 1;
            } else {
              if (ir_verify(ir, stderr)) {
                fprintf(stderr, "hpdlc: internal error: the backward graphs do not verify\n");
                status = 3;
              }
              ad_print(ad, stdout);
            }
          } else if (!strcmp(cli.stage, "schedule")) {
            /* the per-rank instruction lists of one step under the layout */
            const SemLayout *L = &m->layout;
            SchedProgram prog_s;
            char why[256];
            int pp = L->pp > 0 ? (int)L->pp : 1, v = L->virtual_stages > 0 ? (int)L->virtual_stages : 1;
            Schedule kind = L->schedule < 0 ? (v > 1 ? SCHED_INTERLEAVED : SCHED_1F1B) : (Schedule)L->schedule;
            int mb = L->num_micro_batches > 0 ? (int)L->num_micro_batches : 1;
            if (sched_build(&prog_s, kind, pp, mb, v, why, sizeof why) != 0) {
              fprintf(stderr, "hpdlc: %s: %s\n", cli.files[i], why);
              status = 1;
            } else {
              printf("# %s schedule: %d pipeline rank%s, %d micro-batch%s, %d virtual stage%s\n", sem_schedule_name(kind), pp,
                     pp == 1 ? "" : "s", mb, mb == 1 ? "" : "es", v, v == 1 ? "" : "s");
              /* chunk c (forward F c / backward B c) runs these layers */
              const char *split_why = NULL;
              int64_t *split = pp * v > 1 ? plan_chunk_layers(arena, m, m->train.micro_batch, L->tp, L->cp, L->sp == 1,
                                                               L->recompute < 0 ? RECOMPUTE_NONE : L->recompute, (int64_t)pp * v,
                                                               &split_why)
                                          : NULL;
              if (split) {
                printf("# chunks: ");
                for (int c = 0; c < pp * v; c++) printf("%s%" PRId64, c ? "+" : "", split[c]);
                printf(" layers (balance = %s)\n", sem_balance_name(m->layout.balance));
              }
              sched_print(stdout, &prog_s, 0);
              sched_free(&prog_s);
            }
          } else if (!strcmp(cli.stage, "stash")) {
            /* each pipeline chunk's step cut into forward and backward, and what a micro-batch keeps between */
            int st = emit_stash(arena, diag, m, ir, stdout);
            if (st) status = st;
          } else if (!strcmp(cli.stage, "spmd")) {
            SimLayout sl = emit_declared_layout(m);
            SpmdSpec spec = emit_declared_spec(m);
            IrModule *part = spmd_partition(arena, diag, ir, &spec);
            int64_t chunks = sl.pp * sl.vpp;
            const char *split_why = NULL;
            Recompute rcp = sl.recompute;
            int64_t *split = part ? plan_chunk_layers(arena, m, m->train.micro_batch, spec.tp, spec.cp, spec.sp, rcp, chunks,
                                                      &split_why)
                                  : NULL;
            if (part && !split) {
              fprintf(stderr, "hpdlc: %s: the pipeline stages cannot be split: %s\n", cli.files[i], split_why);
              status = 1;
            }
            PipeResult *pr = split ? pipe_split(arena, diag, part, chunks, split) : NULL;
            if (pr && ir_verify(pr->m, stderr)) {
              fprintf(stderr, "hpdlc: internal error: the partitioned IR does not verify\n");
              status = 3;
            }
            if (pr) {
              printf("# per-rank program: tp=%" PRId64 " cp=%" PRId64 " sp=%s, %d pipeline chunk%s", spec.tp, spec.cp,
                     spec.sp ? "on" : "off", pr->nchunks, pr->nchunks == 1 ? "" : "s");
              if (pr->nchunks > 1) {
                printf(" of ");
                for (int c = 0; c < pr->nchunks; c++) printf("%s%" PRId64, c ? "+" : "", pr->layers[c]);
                printf(" %s (balance = %s)", pr->by_cuts ? "pieces of the forward, cut where one activation crosses" : "layers",
                       sem_balance_name(m->layout.balance));
              }
              printf("\n");
              ir_print(pr->m, stdout);
            }
          } else if (!strcmp(cli.stage, "dp")) {
            status = emit_dp(arena, diag, cli.files[i], m, ir, status);
          } else if (!strcmp(cli.stage, "memory")) {
            status = emit_memory(arena, diag, cli.files[i], m, !cli.compile.fusion_off, status);
          } else if (!strcmp(cli.stage, "cuda")) {
            status = emit_cuda(arena, diag, cli.files[i], m, cli.pipe_stage, !cli.compile.fusion_off, stdout);
          } else if (!strcmp(cli.stage, "fused")) {
            FuseResult *fr = fuse_module_opts(arena, ir, fuse_options(0, !cli.compile.fusion_off));
            if (fuse_check(fr, stderr)) {
              fprintf(stderr, "hpdlc: internal error: the fusion does not check\n");
              status = 3;
            }
            fuse_print(fr, stdout);
          } else {
            ir_print(ir, stdout);
          }
        } else if (m == NULL && diag_error_count(diag) == before) {
          fprintf(stderr, "hpdlc: %s declares no model\n", cli.files[i]);
          status = 1;
        }
      } else if (!strcmp(cli.verb, "compile")) {
        int bad_cli = 0;
        SemOptions opts = {cli.defines, cli.ndefines, cli.layout, cli.nlayout, cli.model, &bad_cli};
        SemModel *m = sema_check(arena, diag, &prog, &opts);
        if (bad_cli) status = 2;
        if (m && diag_error_count(diag) == before) {
          cli.compile.source = cli.files[i];
          cli.compile.quiet = cli.quiet;
          int s = compile_artifact(arena, diag, m, &cli.compile, stdout, stderr);
          if (s > status) status = s;
        } else if (!m && diag_error_count(diag) == before) {
          fprintf(stderr, "hpdlc: %s declares no model\n", cli.files[i]);
          status = 1;
        }
      } else if (!strcmp(cli.verb, "plan")) {
        /* --search frees every degree the command line does not fix */
        SemDefine layout[NLAYOUT_FLAGS * 2 + 16];
        int nlayout = 0;
        if (cli.plan.search) {
          static const char *const keys[] = {"parallel.data",     "parallel.tensor",   "parallel.pipeline",
                                             "parallel.context",  "parallel.sequence", "parallel.zero",
                                             "parallel.schedule", "parallel.virtual",  "parallel.recompute",
                                             "parallel.fused_ce", "parallel.expert_tensor"};
          for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            int given = 0;
            for (int j = 0; j < cli.nlayout; j++) given |= !strcmp(cli.layout[j].name, keys[k]);
            if (!given) layout[nlayout++] = (SemDefine){keys[k], "auto", "--search"};
          }
        }
        for (int j = 0; j < cli.nlayout; j++) layout[nlayout++] = cli.layout[j];
        int bad_cli = 0;
        SemOptions opts = {cli.defines, cli.ndefines, layout, nlayout, cli.model, &bad_cli};
        SemModel *m = sema_check(arena, diag, &prog, &opts);
        if (bad_cli) status = 2;
        if (m && diag_error_count(diag) == before) {
          int s = plan_command(diag, cli.files[i], m, &cli.plan);
          if (s > status) status = s;
        } else if (!m && diag_error_count(diag) == before) {
          fprintf(stderr, "hpdlc: %s declares no model\n", cli.files[i]);
          status = 1;
        }
      } else {
        int bad_cli = 0;
        SemOptions opts = {cli.defines, cli.ndefines, cli.layout, cli.nlayout, cli.model, &bad_cli};
        SemModel *m = sema_check(arena, diag, &prog, &opts);
        if (bad_cli) status = 2;
        int cut_ok = 1;
        if (m && diag_error_count(diag) == before) check_partition(arena, diag, m);
        if (m && diag_error_count(diag) == before) check_pipeline_cuts(arena, diag, m);
        cut_ok = diag_error_count(diag) == before;
        if (m && cut_ok && !cli.quiet) print_summary(cli.files[i], m);
        else if (!m && diag_error_count(diag) == before && !cli.quiet)
          printf("%s: ok: declarations only, no model\n", cli.files[i]);
      }
    }
    if (diag_error_count(diag) != before && status == 0) status = 1;
    arena_free(arena);
  }
  diag_free(diag);
  for (int i = 0; i < cli.ndefines; i++) free((char *)cli.defines[i].name);
  free(cli.files);
  return status;
}
