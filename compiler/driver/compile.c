/* compile.c - the artifact of a checked model (see compile.h). */
#include "compile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "program_ir.h"
#include "autodiff.h"
#include "precision.h"
#include "codegen.h"
#include "crc32c.h"
#include "codegen_cuda.h"
#include "progress.h"
#include "extcall.h"
#include "fscopy.h"
#include "fuse.h"
#include "ir.h"
#include "lower.h"
#include "moepack.h"
#include "memplan.h"
#include "pipeline.h"
#include "plan.h"
#include "schedule.h"
#include "spmd.h"

#ifndef HPDL_VERSION
#define HPDL_VERSION "0"
#endif

int compile_executor_parse(const char *s) {
  if (!strcmp(s, "auto")) return COMPILE_EXEC_AUTO;
  if (!strcmp(s, "native")) return COMPILE_EXEC_NATIVE;
  if (!strcmp(s, "interp")) return COMPILE_EXEC_INTERP;
  return -1;
}

typedef struct {
  const SemModel *m;
  const CompileOptions *o;
  Arena *arena;
  Diag *diag;
  FILE *err;
  const char *file;
  time_t started; /* files older than this in DIR are not this compile's */
  Progress *pg;   /* the progress line, cleared before a message */
} Cx;

static int cfail(Cx *C, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cfail(Cx *C, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  progress_clear(C->pg);
  fprintf(C->err, "hpdlc: %s: ", C->file);
  vfprintf(C->err, fmt, ap);
  fputc('\n', C->err);
  va_end(ap);
  return 1;
}

/* ---- files ---- */

static int mkdirs(const char *path) {
  char buf[4096];
  size_t n = strlen(path);
  if (n >= sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++)
    if (buf[i] == '/' || buf[i] == 0) {
      char c = buf[i];
      buf[i] = 0;
      if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
      buf[i] = c;
    }
  struct stat st;
  if (stat(path, &st) != 0) return -1;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return -1;
  }
  return 0;
}

/* The CPU program: $HPDL_PROGRAM_LIB, else bin/../lib/hpdl-program.so
 * beside this executable (the build tree's layout and an install's). */
static const char *program_lib(Cx *C, char *buf, size_t n) {
  if (C->o->program_lib) return C->o->program_lib;
  const char *env = getenv("HPDL_PROGRAM_LIB");
  if (env && *env) return env;
  char exe[4096];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k <= 0) return NULL;
  exe[k] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = 0;
  if ((size_t)snprintf(buf, n, "%s/../lib/hpdl-program.so", exe) >= n) return NULL;
  return buf;
}

/* ---- extern libraries ----
 *
 * Every extern's library must load and have its functions at compile time
 * (a mistake surfaces here, not on the ranks). A library named with a slash
 * (lower.c resolved it against the declaring file's folder) is copied into
 * DIR/extern/, so the artifact needs nothing from the source tree; a bare
 * name stays a name for the dlopen search path of the machine that runs it.
 * The chunk files then name the copy relative to the artifact. */

static json_t *dims_json(int rank, const int64_t *dims);

/* Every extern's library and functions, each failure a diagnostic at its
 * declaration (one per declaration). */
static int externs_check(Cx *C, const IrModule *m) {
  int bad = 0;
  for (int i = 0; i < m->nexterns; i++) {
    const IrExtern *e = &m->externs[i];
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) seen = !strcmp(m->externs[j].where, e->where);
    if (!C->o->allow_native) { /* loading a library runs its code (its constructors first): only by consent */
      if (seen) continue;
      diag_error(C->diag, e->span, "extern %s: its library %s is native code, loaded only with --allow-native", e->name, e->library);
      diag_hint(C->diag, "hpdlc compile and hpdlrun load an extern's library, running its code with your rights, only when "
                         "given --allow-native; check, plan and emit never load it");
      bad = 1;
      continue;
    }
    char why[2048];
    int rc = seen ? 0 : extcall_check(e, why, sizeof why);
    if (rc == 0) continue;
    diag_error(C->diag, e->span, "extern %s: %s", e->name, why);
    if (rc == -2)
      diag_hint(C->diag, "`nm -D --defined-only %s` lists the functions it has", e->path);
    else if (strchr(e->library, '/'))
      diag_hint(C->diag, "a library named with a slash is found relative to the folder of the file that declares it");
    else
      diag_hint(C->diag, "a bare library name is found through the dlopen search path (LD_LIBRARY_PATH); write \"./%s\" for one "
                         "beside the file", e->library);
    bad = 1;
  }
  return bad;
}

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* Copies the libraries and points the table at the copies. */
static int externs_copy(Cx *C, IrModule *m) {
  char dir[4200], dst[4400], why[1024];
  snprintf(dir, sizeof dir, "%s/extern", C->o->out_dir);
  const char **src = arena_alloc(C->arena, sizeof(char *) * (size_t)(m->nexterns + 1));
  for (int i = 0; i < m->nexterns; i++) {
    IrExtern *e = &m->externs[i];
    src[i] = e->path;
    if (!strchr(e->library, '/')) continue;
    const char *file = NULL;
    for (int j = 0; j < i && !file; j++) /* one copy per library */
      if (!strcmp(src[j], src[i]) && strchr(m->externs[j].library, '/')) file = m->externs[j].path;
    if (!file) {
      file = arena_printf(C->arena, "extern/%s", base_name(src[i]));
      for (int j = 0; j < i; j++) /* another library of the same name gets its index in front */
        if (!strcmp(m->externs[j].path, file)) file = arena_printf(C->arena, "extern/%d-%s", i, base_name(src[i]));
      if (mkdirs(dir) != 0) return cfail(C, "cannot make %s: %s", dir, strerror(errno));
      snprintf(dst, sizeof dst, "%s/%s", C->o->out_dir, file);
      if (fs_copy_file(src[i], dst, why, sizeof why)) return cfail(C, "copying the library of extern %s: %s", e->name, why);
    }
    e->path = file;
  }
  return 0;
}

/* The manifest's "externs": what the artifact calls, and the copies it carries. */
static json_t *externs_json(const IrModule *m) {
  json_t *list = json_array();
  for (int i = 0; i < m->nexterns; i++) {
    const IrExtern *e = &m->externs[i];
    json_t *je = json_pack("{s:s, s:s, s:s, s:s}", "name", e->name, "declared", e->where, "library", e->library, "symbol", e->symbol);
    json_object_set_new(je, "grad", e->grad ? json_string(e->grad) : json_null());
    json_object_set_new(je, "file", strchr(e->library, '/') ? json_string(e->path) : json_null());
    json_object_set_new(je, "dims", dims_json(e->ndims, e->dims));
    json_array_append_new(list, je);
  }
  return list;
}

/* ---- the artifact's files ----
 *
 * The manifest lists every file of the artifact (but itself) with its size
 * and CRC-32C; hpdlrun checks them all before it loads any library
 * (artifact_check_files), so a folder copied in part, a file damaged, or one
 * swapped in from another compile is refused by name instead of loaded. A
 * checksum beside the files guards against accidents, not against someone
 * who can also rewrite the manifest (docs/runtime.md). Listed: the files of
 * DIR and DIR/extern/ this compile wrote (modified since it started), not
 * what else a user keeps there (an older compile's leftovers, a checkpoint
 * folder), whose later removal must not break the artifact. */

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Appends dir/rel's files to list, in name order, folders walked. */
static int files_walk(Cx *C, const char *root, const char *rel, json_t *list) {
  char path[4400];
  snprintf(path, sizeof path, "%s%s%s", root, *rel ? "/" : "", rel);
  DIR *d = opendir(path);
  if (!d) return cfail(C, "cannot list %s: %s", path, strerror(errno));
  char **names = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *de; (de = readdir(d));) {
    const char *s = de->d_name;
    if (s[0] == '.' || strstr(s, ".tmp.") || (!*rel && !strcmp(s, "manifest.json"))) continue; /* temporaries, itself */
    if (n == cap) {
      cap = cap ? 2 * cap : 32;
      char **grown = realloc(names, cap * sizeof *names);
      if (!grown) break;
      names = grown;
    }
    names[n++] = arena_printf(C->arena, "%s%s%s", rel, *rel ? "/" : "", s);
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, name_cmp);
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    char full[4400];
    snprintf(full, sizeof full, "%s/%s", root, names[i]);
    struct stat st;
    if (lstat(full, &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (!*rel && !strcmp(names[i], "extern")) rc = files_walk(C, root, names[i], list);
    } else if (S_ISREG(st.st_mode) && st.st_mtime >= C->started - 1) {
      int64_t bytes;
      uint32_t crc;
      if (crc32c_file(full, &bytes, &crc) != 0) {
        rc = cfail(C, "cannot read %s: %s", full, strerror(errno));
        break;
      }
      char hex[16];
      snprintf(hex, sizeof hex, "%08x", crc);
      json_array_append_new(list, json_pack("{s:s, s:I, s:s}", "path", names[i], "bytes", (json_int_t)bytes, "crc32c", hex));
    }
  }
  free(names);
  return rc;
}

/* ---- the layout ---- */

typedef struct {
  int64_t dp, tp, pp, cp, vpp, mb, nmicro, zero;
  int sp;
  Recompute recompute;
  Schedule schedule;
  int64_t ep; /* expert parallelism inside dp (1: none) */
  int ep_fold; /* the expert group folded over tensor x data ranks (parallel.expert_tensor = 1) */
  int64_t vocab_pad; /* parallel.vocab_pad (spmd.h) */
} Layout;

static int resolve_layout(Cx *C, Layout *L) {
  const SemLayout *s = &C->m->layout;
  struct {
    const char *key, *flag;
    int64_t v;
  } deg[] = {{"data", "--dp", s->dp}, {"tensor", "--tp", s->tp}, {"pipeline", "--pp", s->pp}, {"context", "--cp", s->cp}};
  for (size_t i = 0; i < sizeof deg / sizeof deg[0]; i++)
    if (deg[i].v < 1)
      return cfail(C, "compile needs a concrete layout, but parallel.%s is auto (choose it with %s N, or let `hpdlc plan --search` "
                      "suggest one)", deg[i].key, deg[i].flag);
  L->dp = s->dp, L->tp = s->tp, L->pp = s->pp, L->cp = s->cp;
  if (s->ep < 0)
    return cfail(C, "compile needs a concrete layout, but parallel.expert is auto (choose it with --ep N, or let `hpdlc plan "
                    "--search` suggest one)");
  if (s->expert_tensor < 0 && s->tp > 1 && s->ep > 1) /* (folding means nothing without both) */
    return cfail(C, "compile needs a concrete layout, but parallel.expert_tensor is auto (choose it with --etp 1 or --etp %" PRId64
                    ", or let `hpdlc plan --search` suggest one)", s->tp);
  if (s->cp_comm < 0 && s->cp > 1) /* (at cp 1 there is nothing to exchange) */
    return cfail(C, "compile needs a concrete layout, but parallel.cp_comm is auto (choose it with --cp-comm allgather or "
                    "--cp-comm ring, or let `hpdlc plan --search` suggest one)");
  L->ep = s->ep > 1 ? s->ep : 1;
  L->ep_fold = s->ep_fold; /* sema: expert_tensor = 1 with tensor > 1 and expert > 1 */
  L->vocab_pad = s->vocab_pad > 0 ? s->vocab_pad : 0;
  L->vpp = s->virtual_stages > 0 ? s->virtual_stages : 1;
  L->sp = s->sp == 1;
  L->zero = s->zero > 0 ? s->zero : 0;
  L->recompute = s->recompute < 0 ? RECOMPUTE_NONE : (Recompute)s->recompute;
  L->schedule = s->schedule < 0 ? (L->vpp > 1 ? SCHED_INTERLEAVED : SCHED_1F1B) : (Schedule)s->schedule;
  if (L->vpp > 1 && L->schedule != SCHED_INTERLEAVED)
    return cfail(C, "%" PRId64 " virtual pipeline stages run the interleaved schedule, not %s (--schedule interleaved)", L->vpp,
                 sem_schedule_name(L->schedule));
  if (L->vpp > 1 && L->pp < 2) return cfail(C, "virtual pipeline stages need at least two pipeline stages (--pp)");
  L->mb = C->m->train.micro_batch;
  if (L->mb < 1) return cfail(C, "train.micro_batch must be set");
  L->nmicro = s->num_micro_batches;
  if (L->nmicro < 1) {
    int64_t per = L->dp * L->mb;
    if (C->m->train.global_batch < 1 || C->m->train.global_batch % per)
      return cfail(C, "the global batch (%" PRId64 ") is not a multiple of dp x micro_batch (%" PRId64 ")", C->m->train.global_batch, per);
    L->nmicro = C->m->train.global_batch / per;
  }
  return 0;
}

/* ---- which chunk reads which parameter copy ---- */

/* used[p][l]: chunk reads copy l of parameter p. Graphs a CALL runs read
 * the copies of its layers (first .. first + count - 1), as interp.c does. */
static void mark_uses(const IrModule *m, int gi, int64_t first, int64_t count, char **used, int depth) {
  if (depth > 16) return;
  const IrGraph *g = m->graphs[gi];
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    if (n->op == IR_PARAM) {
      const IrParam *p = &m->params[n->attr[0]];
      if (p->count > 1) {
        for (int64_t l = first; l < first + count && l < p->count; l++) used[n->attr[0]][l] = 1;
      } else {
        used[n->attr[0]][0] = 1;
      }
    } else if (n->op == IR_CALL && n->attr[0] > gi && n->attr[0] < m->ngraphs) {
      mark_uses(m, (int)n->attr[0], n->attr[3], n->attr[1], used, depth + 1);
    }
  }
}

static int find_param(const IrModule *m, const char *name) {
  for (int i = 0; i < m->nparams; i++)
    if (!strcmp(m->params[i].name, name)) return i;
  return -1;
}

/* ---- the manifest ---- */

static json_t *dims_json(int rank, const int64_t *dims) {
  json_t *a = json_array();
  for (int i = 0; i < rank; i++) json_array_append_new(a, json_integer(dims[i]));
  return a;
}

static const char *init_name(InitKind k) {
  static const char *const n[] = {"zeros", "ones", "constant", "normal", "uniform"};
  return n[k];
}

static json_t *train_json(const SemModel *m) {
  const SemTrain *t = &m->train;
  static const char *const decay[] = {"none", "cosine", "linear"};
  json_t *opt = json_pack("{s:s, s:f, s:[f, f], s:f, s:f, s:f, s:I, s:s, s:f}", "kind", t->optimizer == OPT_SGD ? "sgd" : "adamw",
                          "lr", t->lr, "betas", t->beta1, t->beta2, "eps", t->eps, "weight_decay", t->weight_decay, "momentum",
                          t->momentum, "warmup", (json_int_t)t->warmup, "decay", decay[t->decay], "min_lr", t->min_lr);
  json_t *tr = json_pack("{s:I, s:I, s:I, s:b, s:f, s:o}", "steps", (json_int_t)(t->steps > 0 ? t->steps : 1000), "seed",
                         (json_int_t)(t->seed >= 0 ? t->seed : 0), "log_every", (json_int_t)(t->log_every > 0 ? t->log_every : 10),
                         "shuffle", 1, "clip", t->clip > 0 ? t->clip : 0.0, "optimizer", opt);
  if (t->data) json_object_set_new(tr, "data", json_string(t->data));
  /* fp16 trains under a loss scale (0: dynamic; runtime/train.c) */
  json_object_set_new(tr, "precision", json_string(sem_precision_name(t->precision)));
  if (t->moments_bf16) json_object_set_new(tr, "moments", json_string("bf16")); /* absent: fp32 */
  if (t->precision == PREC_FP16) json_object_set_new(tr, "loss_scale", json_real(t->loss_scale > 0 ? t->loss_scale : 0.0));
  json_t *ck = json_pack("{s:I, s:I, s:b}", "every", (json_int_t)(t->ckpt_every > 0 ? t->ckpt_every : 0), "keep",
                         (json_int_t)(t->ckpt_keep >= 0 ? t->ckpt_keep : 3), "async", t->ckpt_async ? 1 : 0);
  if (t->ckpt_dir) json_object_set_new(ck, "dir", json_string(t->ckpt_dir));
  json_object_set_new(tr, "checkpoint", ck);
  return tr;
}

/* ---- the chunks ---- */

/* The instruction list of the pipeline rank that holds pc's chunk
 * (schedule.h), recorded in the chunk file for the runtime: the schedule
 * asked for, or, where schedule.c rejects the shape, one micro-batch in
 * flight (sched_build_sequential). */
static int chunk_schedule(Arena *arena, ProgramChunk *pc, Schedule kind, int pp, int m, int v) {
  SchedProgram prog;
  char why[256];
  if (sched_build(&prog, kind, pp, m, v, why, sizeof why) && sched_build_sequential(&prog, pp, m, v)) return -1;
  int r = sched_chunk_rank(pp, pc->chunk);
  pc->schedule = kind; /* asked for: the runtime rebuilds with it for another micro-batch count */
  pc->sched_m = m;
  pc->sched_v = v;
  pc->nins = prog.len[r];
  pc->ins = arena_alloc(arena, sizeof(SchedInstr) * (size_t)(pc->nins + 1));
  memcpy(pc->ins, prog.ins[r], sizeof(SchedInstr) * (size_t)pc->nins);
  sched_free(&prog);
  return 0;
}

typedef struct {
  IrModule *m;
  AdResult *ad;
  int nforward;
  FuseResult *fr;
  MemPlan *plan;
  char **used; /* per parameter, per copy */
  ProgramChunk pc;
  int native; /* kernels written */
  int nnodes;
} Chunk;

static const char *source_path(void *diag, int file) { return diag_file_path(diag, file); }

static int is_cuda(const CompileOptions *o) { return o->target && !strcmp(o->target, "cuda"); }

static int kernels_build(Cx *C, Chunk *k, const char *path, char *why, size_t n) {
  int cuda = is_cuda(C->o);
  const CgBackend *be = cg_backend(cuda ? "cuda" : "cpu");
  if (!be) {
    snprintf(why, n, "the CPU back end is not built into this hpdlc (no LLVM at configure time)");
    return -1;
  }
  CgOptions opt;
  memset(&opt, 0, sizeof opt);
  opt.memplan = k->plan;
  opt.arch = C->o->arch;
  opt.emulate = cuda && C->o->emulate;
  opt.moments16 = cuda && C->m->train.moments_bf16;
  opt.source_path = source_path;
  opt.source_ctx = C->diag;
  char err[1024] = "";
  CgTarget *t = be->create(k->m, k->fr, &opt, err, sizeof err);
  if (!t) {
    snprintf(why, n, "%s", err);
    return -1;
  }
  int rc = be->generate(t);
  if (rc == 0) rc = be->emit(t, path);
  if (rc) snprintf(why, n, "%s", be->error(t) ? be->error(t) : "the back end failed");
  if (rc == 0 && cuda && C->o->verbose) {
    fprintf(C->err, "hpdlc: %s:\n", path);
    cg_cuda_report(t, C->err);
  }
  be->destroy(t);
  return rc;
}

static int compile_run(Arena *arena, Diag *diag, const SemModel *m, const CompileOptions *o, FILE *out, FILE *err, Progress *pg);

/* What the runtime's data loader feeds the model's two inputs: token
 * windows (tokens and targets, integer [B, T]) or labelled images (a float
 * [B, ...] input and an integer [B] one, the labels), and what the loader
 * checks the data against (the vocabulary, the classes). */
typedef struct {
  ProgramFeed feed[2];
  int images;             /* 1: images and labels */
  int image, label;       /* the inputs' indices, for images */
  int64_t vocab, classes; /* 0: not found */
} Feeds;

static const char *input_str(Arena *arena, const IrInput *x) {
  const char *s = arena_printf(arena, "%s: %s[", x->name ? x->name : "?", sem_dtype_name(x->dtype));
  for (int k = 0; k < x->rank; k++) s = arena_printf(arena, "%s%s%" PRId64, s, k ? ", " : "", x->dims[k]);
  return arena_printf(arena, "%s]", s);
}

static int input_feeds(Cx *C, const IrModule *global, const Layout *L, Feeds *f) {
  const SemModel *m = C->m;
  memset(f, 0, sizeof *f);
  static const char forms[] = "the runtime feeds token windows (two integer [B, T] inputs: the tokens and the targets) or labelled "
                              "images (a float [B, C, H, W] input and an integer [B] input, the labels)";
  if (global->ninputs != 2)
    return cfail(C, "%s; the model takes %d input%s", forms, global->ninputs, global->ninputs == 1 ? "" : "s");
  const IrInput *in = global->inputs;
  int nfloat = sem_dtype_is_float(in[0].dtype) + sem_dtype_is_float(in[1].dtype);
  const IrGraph *g0 = global->graphs[0];
  if (nfloat == 0 && in[0].rank == 2 && in[1].rank == 2) {
    if (m->seq_len < 1) return cfail(C, "the sequence length (the second dimension of the first input) must be a constant");
    f->feed[0] = PROGRAM_FEED_TOKENS, f->feed[1] = PROGRAM_FEED_TARGETS;
    for (int i = 0; i < 2; i++) {
      const IrInput *x = &in[i];
      if (x->dims[0] != L->mb || x->dims[1] != m->seq_len)
        return cfail(C, "the CPU runtime feeds token windows: input %s must be an integer [B, T] tensor (T = %" PRId64 ")",
                     x->name ? x->name : "?", m->seq_len);
      if (x->name && !strcmp(x->name, "targets")) f->feed[i] = PROGRAM_FEED_TARGETS, f->feed[1 - i] = PROGRAM_FEED_TOKENS;
    }
    /* the vocabulary: rows of the table the tokens index */
    int tok = f->feed[0] == PROGRAM_FEED_TOKENS ? 0 : 1;
    for (int i = 0; i < g0->nnodes && !f->vocab; i++) {
      const IrNode *n = &g0->nodes[i];
      if (n->op == IR_EMBEDDING && n->nin == 2 && g0->nodes[n->in[1]].op == IR_INPUT && g0->nodes[n->in[1]].attr[0] == tok &&
          g0->nodes[n->in[0]].op == IR_PARAM)
        f->vocab = global->params[g0->nodes[n->in[0]].attr[0]].dims[0];
    }
    return 0;
  }
  if (nfloat != 1)
    return cfail(C, "%s; the model's inputs are %s and %s", forms, input_str(C->arena, &in[0]), input_str(C->arena, &in[1]));
  f->images = 1;
  f->image = sem_dtype_is_float(in[0].dtype) ? 0 : 1;
  f->label = 1 - f->image;
  const IrInput *x = &in[f->image], *y = &in[f->label];
  /* the loader hands over f32 pixels and i32 labels as they are */
  if (x->dtype != DT_F32 || x->rank < 2 || x->dims[0] != L->mb)
    return cfail(C, "the runtime feeds labelled images: the float input must be f32[B, ...] (B the micro batch, %" PRId64
                    ", then an image's dimensions, as f32[B, 3, 32, 32]); it is %s",
                 L->mb, input_str(C->arena, x));
  if (y->dtype != DT_I32 || y->rank != 1 || y->dims[0] != L->mb)
    return cfail(C, "the runtime feeds labelled images: the integer input, the labels, must be i32[B] (B the micro batch, %" PRId64
                    "); it is %s",
                 L->mb, input_str(C->arena, y));
  if (L->cp > 1 || L->sp)
    return cfail(C, "context and sequence parallelism split a sequence, which an image model (input %s) has not: use cp = 1 and no sp",
                 x->name ? x->name : "?");
  f->feed[f->image] = PROGRAM_FEED_IMAGES;
  f->feed[f->label] = PROGRAM_FEED_LABELS;
  /* the classes: the last dimension of the logits cross_entropy compares the labels with */
  for (int i = 0; i < g0->nnodes && !f->classes; i++) {
    const IrNode *n = &g0->nodes[i];
    if (n->op == IR_CROSS_ENTROPY && n->nin == 2 && g0->nodes[n->in[1]].op == IR_INPUT && g0->nodes[n->in[1]].attr[0] == f->label) {
      const IrNode *lg = &g0->nodes[n->in[0]];
      if (lg->rank >= 1) f->classes = lg->dims[lg->rank - 1];
    }
  }
  return 0;
}

/* The compile with its progress line (core/progress.h), cleared before the
 * summary or an error. */
int compile_artifact(Arena *arena, Diag *diag, const SemModel *m, const CompileOptions *o, FILE *out, FILE *err) {
  Progress *pg = progress_start(o->quiet ? PROGRESS_QUIET : o->progress, err, "hpdlc compile");
  int rc = compile_run(arena, diag, m, o, out, err, pg);
  progress_end(pg);
  return rc;
}

static int compile_run(Arena *arena, Diag *diag, const SemModel *m, const CompileOptions *o, FILE *out, FILE *err, Progress *pg) {
  Cx C = {m, o, arena, diag, err, o->source ? o->source : "input", time(NULL), pg};
  if (o->target && strcmp(o->target, "cpu") && strcmp(o->target, "cuda"))
    return cfail(&C, "target %s is not built into this hpdlc (there are: cpu, cuda)", o->target);
  if (is_cuda(o) && o->executor == COMPILE_EXEC_INTERP)
    return cfail(&C, "--executor interp runs the reference executor on the CPU; it has no CUDA form (use --target cpu)");
  if (!o->out_dir || !*o->out_dir) return cfail(&C, "compile needs an output folder (-o DIR)");
  if (sem_precision_priced_only(m->train.precision))
    return cfail(&C, "precision = %s is priced by hpdlc plan, but no back end runs it yet: compile with bf16 or fp16",
                 sem_precision_name(m->train.precision));
  if (m->layout.dispatcher == 1)
    return cfail(&C, "dispatcher = deepep is priced by hpdlc plan, but the runtime exchanges the experts' tokens with NCCL's or "
                     "MPI's all-to-all, a copy per rank: compile with dispatcher = alltoall (the same numbers)");
  if (m->layout.engine == 1)
    return cfail(&C, "engine = deepspeed prices DeepSpeed's pipeline engine in hpdlc plan; hpdl's runtime runs its own "
                     "program: compile with engine = hpdl (the same numbers)");
  Layout L;
  memset(&L, 0, sizeof L);
  if (resolve_layout(&C, &L)) return 1;
  if (m->layout.cp_comm == 1 && L.cp > 1 && o->materialize_attention)
    return cfail(&C, "cp_comm = ring runs the attention op a block of keys at a time; --attention materialized forms each "
                     "row's scores whole, from keys gathered first: compile with cp_comm = allgather, or without --attention");

  /* lower, partition, split */
  progress_phase(pg, "lowering and partitioning (tp %" PRId64 ", cp %" PRId64 ", pp %" PRId64 ")", L.tp, L.cp, L.pp * L.vpp);
  LowerOptions lo = {0, o->materialize_attention, 0};
  IrModule *global = lower_model_with(arena, diag, m, L.mb, &lo);
  if (!global) return 1;
  if (ir_verify(global, err)) {
    fprintf(err, "hpdlc: internal error: the IR does not verify\n");
    return 3;
  }
  if (externs_check(&C, global)) return 1;
  /* dropless experts over their routed rows; expert parallelism's all-to-all
   * exchanges fixed-size slots, and a layer whose slots something else reads
   * stays over them (moepack.c) */
  int packed_moe = !o->expert_slots && L.ep == 1 ? moe_pack_dropless(global) : 0;
  int slots_moe = moe_dropless_slots(global), dropping_moe = moe_dropping(global);
  /* MoE parallel folding: each tensor rank routes its own chunk of the sequences
   * (under context parallelism its piece of its context chunk: the partitioner's) */
  const char *fold_why = NULL;
  int folded_moe = !L.ep_fold ? 0 : L.cp > 1 ? moe_fold_check_cp(global, &fold_why) : moe_fold_sequences(global, L.tp, 0, &fold_why);
  if (folded_moe < 0)
    return cfail(&C, "expert_tensor = 1 (the expert group folded over tensor x data ranks) cannot split a mixture-of-experts "
                     "layer: %s; compile with expert_tensor = tensor (--etp %" PRId64 ")",
                 fold_why, L.tp);
  /* expert parallelism's slots expert-major: a GEMM an expert over every slot it was sent */
  int major_moe = L.ep > 1 ? moe_expert_major(global, L.ep) : 0;
  if ((packed_moe || major_moe || folded_moe) && ir_verify(global, err)) {
    fprintf(err, "hpdlc: internal error: the IR does not verify after rewriting the experts' layers\n");
    return 3;
  }
  Feeds F;
  if (input_feeds(&C, global, &L, &F)) return 1;
  ProgramFeed *feed = F.feed;
  /* an image model has no sequence for the partitioner to split */
  SpmdSpec spec = {L.tp, L.cp, L.sp, F.images ? 0 : m->seq_len, L.ep, L.vocab_pad, m->layout.fused_ce == 1, L.ep_fold,
                   m->layout.cp_comm == 1};
  IrModule *part = spmd_partition(arena, diag, global, &spec);
  const char *split_why = NULL;
  int64_t *split = part ? plan_chunk_layers(arena, m, L.mb, L.tp, L.cp, L.sp, L.recompute, L.pp * L.vpp, &split_why) : NULL;
  if (part && !split) return cfail(&C, "the pipeline stages cannot be split: %s", split_why);
  PipeResult *pr = part ? pipe_split(arena, diag, part, L.pp * L.vpp, split) : NULL;
  if (!pr) return 1;
  if (ir_verify(pr->m, err)) {
    fprintf(err, "hpdlc: internal error: the partitioned IR does not verify\n");
    return 3;
  }
  int K = pr->nchunks, storage16 = 0, params16 = 0;
  Chunk *ch = arena_alloc(arena, sizeof(Chunk) * (size_t)K);
  for (int c = 0; c < K; c++) {
    Chunk *k = &ch[c];
    progress_phase(pg, "chunk %d/%d: differentiating, fusing, planning memory", c + 1, K);
    k->m = pipe_chunk_module(arena, pr, c);
    k->nforward = k->m->ngraphs;
    k->used = arena_alloc(arena, sizeof(char *) * (size_t)(k->m->nparams + 1));
    for (int p = 0; p < k->m->nparams; p++) {
      int64_t copies = ir_param_copies(&k->m->params[p]);
      k->used[p] = arena_alloc(arena, (size_t)copies);
    }
    mark_uses(k->m, 0, 0, 1, k->used, 0);
    const char *why = NULL;
    k->ad = ad_build_layers(k->m, L.recompute, m->layout.recompute_layers, &why);
    if (!k->ad) return cfail(&C, "pipeline chunk %d cannot be differentiated: %s", c, why ? why : "?");
    if (ir_verify(k->m, err) || ir_verify_pipeline_cut(k->m->graphs[k->ad->step], err)) {
      fprintf(err, "hpdlc: internal error: chunk %d's training step does not verify\n", c);
      return 3;
    }
    /* mixed precision: activations stored in 16 bits */
    storage16 = prec_storage(m->train.precision) != DT_F32;
    PrecTarget pt = cg_cuda_prec_target(o->arch);
    if (prec_apply(k->m, k->ad, prec_storage(m->train.precision), is_cuda(o) ? &pt : NULL, &why) < 0)
      return cfail(&C, "pipeline chunk %d: 16-bit storage: %s", c, why ? why : "?");
    params16 += prec_params16(k->m);
    for (int gi = 0; gi < k->m->ngraphs; gi++) k->nnodes += k->m->graphs[gi]->nnodes;
    /* the memory plan: the fused plan's arena when fusion checks (what the
     * kernels run in), else the unfused one */
    MemOptions mo;
    mem_options_from_model(m, &mo);
    mo.entry = k->ad->step;
    /* the CUDA back end leaves bias gradients to cuBLASLt's epilogue (fuse.h, rule 8) */
    k->fr = fuse_module_opts(arena, k->m, fuse_options(is_cuda(o), !o->fusion_off));
    if (fuse_check(k->fr, NULL)) k->fr = NULL;
    mo.fusion = k->fr;
    mo.grad_into_slots = !is_cuda(o); /* the CPU back end's .acc kernels (fuse.h) */
    k->plan = mem_plan_module(arena, k->m, &mo);
    if (!k->plan || mem_check(k->plan, NULL)) {
      fprintf(err, "hpdlc: internal error: chunk %d's memory plan does not check\n", c);
      return 3;
    }
  }
  /* owners: the first chunk that reads a copy holds it; later ones mirror it */
  int np = ch[0].m->nparams;
  int **owner = arena_alloc(arena, sizeof(int *) * (size_t)(np + 1));
  for (int p = 0; p < np; p++) {
    const IrParam *P = &ch[0].m->params[p];
    int64_t copies = ir_param_copies(P);
    owner[p] = arena_alloc(arena, sizeof(int) * (size_t)copies);
    for (int64_t l = 0; l < copies; l++) {
      owner[p][l] = -1;
      for (int c = K - 1; c >= 0; c--)
        if (ch[c].used[p][l]) owner[p][l] = c;
    }
  }
  for (int c = 0; c < K; c++) {
    Chunk *k = &ch[c];
    ProgramChunk *pc = &k->pc;
    pc->m = k->m;
    /* the files the nodes' spans name, so the runtime can say where an op comes from */
    k->m->nsources = diag_file_count(diag);
    k->m->sources = arena_alloc(arena, sizeof(char *) * (size_t)(k->m->nsources ? k->m->nsources : 1));
    for (int f = 0; f < k->m->nsources; f++) k->m->sources[f] = diag_file_path(diag, f);
    pc->chunk = c;
    pc->nchunks = K;
    pc->step = k->ad->step;
    pc->nforward = k->nforward;
    pc->recompute = L.recompute;
    pc->feed = feed;
    if (chunk_schedule(arena, pc, L.schedule, (int)L.pp, (int)L.nmicro, (int)L.vpp) < 0)
      return cfail(&C, "no instruction list for pipeline rank %d", c);
    int n = 0;
    for (int p = 0; p < np; p++)
      for (int64_t l = 0; l < ir_param_copies(&k->m->params[p]); l++) n += k->used[p][l];
    pc->uses = arena_alloc(arena, sizeof(ProgramUse) * (size_t)(n + 1));
    for (int p = 0; p < np; p++)
      for (int64_t l = 0; l < ir_param_copies(&k->m->params[p]); l++) {
        if (!k->used[p][l]) continue;
        ProgramUse *u = &pc->uses[pc->nuses++];
        u->param = p;
        u->layer = l;
        u->owner = owner[p][l];
        if (u->owner == c) {
          u->mirrors = arena_alloc(arena, sizeof(int) * (size_t)K);
          for (int d = c + 1; d < K; d++)
            if (ch[d].used[p][l]) {
              if (d % L.pp == c % L.pp)
                return cfail(&C, "parameter %s is read by chunks %d and %d, which pipeline stage %d both holds (virtual stages): not "
                                 "supported yet", k->m->params[p].name, c, d, (int)(c % L.pp));
              u->mirrors[u->nmirrors++] = d;
            }
        }
      }
  }

  /* the files */
  if (mkdirs(o->out_dir) != 0) return cfail(&C, "cannot make the output folder %s: %s", o->out_dir, strerror(errno));
  char path[4096], why[1024], libbuf[4096];
  const char *lib = program_lib(&C, libbuf, sizeof libbuf);
  snprintf(path, sizeof path, "%s/program.so", o->out_dir);
  if (!lib || access(lib, R_OK) != 0)
    return cfail(&C, "the CPU program %s is missing (build the hpdl_program target, or set HPDL_PROGRAM_LIB)", lib ? lib : "hpdl-program.so");
  if (fs_copy_file(lib, path, why, sizeof why)) return cfail(&C, "writing the program: %s", why);
  /* the chunk modules share the global module's extern table */
  if (externs_copy(&C, global)) return 1;
  /* files per chunk: stageS.* (one chunk per stage), chunkC.* with virtual stages */
  const char *fname = L.vpp > 1 ? "chunk" : "stage";
  for (int c = 0; c < K; c++) {
    snprintf(path, sizeof path, "%s/%s%d.hir", o->out_dir, fname, c);
    if (program_ir_write(&ch[c].pc, path, why, sizeof why)) return cfail(&C, "writing chunk %d: %s", c, why);
  }
  /* Kernels per stage: a stage the back end cannot compile runs the
   * reference executor (auto), or the compilation fails (native). */
  int nnative = 0;
  for (int c = 0; c < K && o->executor != COMPILE_EXEC_INTERP; c++) {
    progress_phase(pg, "stage %d/%d: kernels (%s)", c + 1, K, is_cuda(o) ? "CUDA C, NVRTC" : "LLVM");
    if (is_cuda(o)) {
      /* DIR/stageS.cu, .cubin, .ptx, .kernels.json; no fallback: the
       * reference executor is not a GPU program */
      snprintf(path, sizeof path, "%s/%s%d", o->out_dir, fname, c);
      if (!ch[c].fr) return cfail(&C, "generating the CUDA kernels of pipeline stage %d: chunk %d's fusion does not check", c, c);
      if (kernels_build(&C, &ch[c], path, why, sizeof why))
        return cfail(&C, "generating the CUDA kernels of pipeline stage %d: %s", c, why);
      ch[c].native = 1;
      nnative++;
      continue;
    }
    snprintf(path, sizeof path, "%s/%s%d.so", o->out_dir, fname, c);
    unlink(path); /* never a stale library of another compilation */
    if (!ch[c].fr) {
      snprintf(why, sizeof why, "chunk %d's fusion does not check", c);
    } else if (kernels_build(&C, &ch[c], path, why, sizeof why) == 0) {
      ch[c].native = 1;
      nnative++;
      continue;
    }
    unlink(path);
    if (o->executor == COMPILE_EXEC_NATIVE) return cfail(&C, "generating the kernels of pipeline stage %d: %s", c, why);
    progress_clear(pg);
    if (!o->quiet)
      fprintf(err, "hpdlc: %s: note: the CPU back end cannot compile pipeline stage %d (%s); that stage runs the reference executor\n",
              C.file, c, why);
  }
  const char *executor = nnative == K ? "native" : nnative ? "mixed" : "interp";

  /* the manifest */
  int world = (int)(L.dp * L.tp * L.pp * L.cp);
  json_t *root = json_object();
  json_object_set_new(root, "format", json_string("hpdl-artifact"));
  json_object_set_new(root, "version", json_integer(1));
  json_object_set_new(root, "model", json_string(m->model->decl->name.name));
  json_object_set_new(root, "target", json_string(is_cuda(o) ? "cuda" : "cpu"));
  if (is_cuda(o)) json_object_set_new(root, "cuda", json_pack("{s:s}", "arch", o->arch ? o->arch : "sm_80"));
  json_object_set_new(root, "world_size", json_integer(world));
  json_object_set_new(root, "layout",
                      json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:f, s:b}", "dp", (json_int_t)L.dp, "tp",
                                (json_int_t)L.tp, "pp", (json_int_t)L.pp, "cp", (json_int_t)L.cp, "zero", (json_int_t)L.zero,
                                "micro_batch", (json_int_t)L.mb, "num_micro_batches", (json_int_t)L.nmicro, "schedule",
                                sem_schedule_name(L.schedule), "compression", sem_compression_name(m->layout.compression), "topk_ratio",
                                m->layout.topk_ratio > 0 ? m->layout.topk_ratio : 0.01, "error_feedback", 1));
  /* the layers each stage runs (informative: the chunk files carry them) */
  json_t *stage_layers = json_array();
  for (int c = 0; c < K; c++) json_array_append_new(stage_layers, json_integer(pr->layers[c]));
  json_t *jlay = json_object_get(root, "layout");
  json_object_set_new(jlay, pr->by_cuts ? "stage_pieces" : "stage_layers", stage_layers);
  if (L.ep > 1) json_object_set_new(jlay, "ep", json_integer(L.ep));
  if (L.ep_fold) json_object_set_new(jlay, "ep_fold", json_true());
  json_object_set_new(jlay, "balance", json_string(sem_balance_name(m->layout.balance)));
  if (L.cp > 1) json_object_set_new(jlay, "cp_comm", json_string(m->layout.cp_comm == 1 ? "ring" : "allgather"));
  /* where the layout was planned to run: hpdlrun --sbatch / --k8s place
   * the ranks on nodes from it (docs/runtime.md, "Clusters") */
  json_object_set_new(root, "cluster",
                      json_pack("{s:s, s:I, s:I, s:b}", "name", m->layout.cluster_name ? m->layout.cluster_name : "cpu",
                                "gpus_per_node", (json_int_t)(m->layout.gpus_per_node > 0 ? m->layout.gpus_per_node : 1), "nodes",
                                (json_int_t)(m->layout.nodes > 0 ? m->layout.nodes : 1), "shared_device",
                                m->has_cluster && m->cluster.shared_device));
  json_t *inputs;
  if (F.images) {
    const IrInput *x = &global->inputs[F.image];
    inputs = json_pack("{s:s, s:s, s:s, s:o}", "kind", "images", "image", x->name ? x->name : "", "labels",
                       global->inputs[F.label].name ? global->inputs[F.label].name : "", "shape", dims_json(x->rank - 1, x->dims + 1));
    if (F.classes > 0) json_object_set_new(inputs, "classes", json_integer(F.classes));
  } else {
    inputs = json_pack("{s:I}", "seq_len", (json_int_t)m->seq_len);
    if (F.vocab > 0) json_object_set_new(inputs, "vocab", json_integer(F.vocab));
  }
  json_object_set_new(root, "inputs", inputs);
  json_object_set_new(root, "train", train_json(m));
  json_object_set_new(root, "program", json_pack("{s:s, s:s, s:s, s:s}", "kind", "native", "executor", executor, "pipeline_dtype",
                                                   nnative ? "f32" : "f64", "fusion", o->fusion_off ? "off" : "on"));
  json_t *ranks = json_array();
  for (int r = 0; r < world; r++) {
    /* rank = tp_i + tp (cp_i + cp (dp_i + dp pp_i)): the stage is outermost */
    int stage = (int)(r / (L.tp * L.cp * L.dp));
    /* the stage's chunks: stage, stage + pp, ... (module / kernels name the first) */
    int64_t arena_bytes = 0;
    for (int c = stage; c < K; c += (int)L.pp) {
      const MemPlan *pl = ch[c].plan;
      int64_t b = ch[c].native && pl->fused_arena > 0 ? pl->fused_arena : pl->arena;
      if (b > arena_bytes) arena_bytes = b;
    }
    json_t *jr = json_pack("{s:s, s:I, s:s}", "program", "program.so", "arena_bytes", (json_int_t)arena_bytes, "module",
                           arena_printf(arena, "%s%d.hir", fname, stage));
    if (ch[stage].native)
      json_object_set_new(jr, "kernels", json_string(arena_printf(arena, is_cuda(o) ? "%s%d.kernels.json" : "%s%d.so", fname, stage)));
    if (L.vpp > 1) {
      json_t *jc = json_array();
      for (int c = stage; c < K; c += (int)L.pp) {
        json_t *one = json_pack("{s:i, s:s}", "chunk", c, "module", arena_printf(arena, "%s%d.hir", fname, c));
        if (ch[c].native)
          json_object_set_new(one, "kernels", json_string(arena_printf(arena, is_cuda(o) ? "%s%d.kernels.json" : "%s%d.so", fname, c)));
        json_array_append_new(jc, one);
      }
      json_object_set_new(jr, "chunks", jc);
    }
    json_array_append_new(ranks, jr);
  }
  json_object_set_new(root, "ranks", ranks);
  json_object_set_new(root, "externs", externs_json(global));
  json_t *params = json_array();
  int64_t nlogical = 0;
  for (int gp = 0; gp < global->nparams; gp++) {
    const IrParam *P = &global->params[gp];
    int64_t copies = ir_param_copies(P);
    nlogical += copies;
    int cp = find_param(ch[0].m, P->name), pp = find_param(pr->m, P->name);
    json_t *jp = json_pack("{s:s, s:s, s:o, s:I}", "name", P->name, "dtype", "f32", "shape", dims_json(P->rank, P->dims), "count",
                           (json_int_t)copies);
    json_t *init = json_pack("{s:s}", "kind", init_name(P->init.kind));
    if (P->init.kind != INIT_ZEROS && P->init.kind != INIT_ONES) {
      json_object_set_new(init, "a", json_real(P->init.a));
      json_object_set_new(init, "b", json_real(P->init.b));
    }
    json_object_set_new(jp, "init", init);
    const IrParam *S = pp >= 0 ? &pr->m->params[pp] : NULL;
    if (S && S->split_axis >= 0 && (S->split_group == IRG_TP || S->split_group == IRG_CP || S->split_group == IRG_EP)) {
      json_t *js = json_pack("{s:i, s:s}", "axis", S->split_axis, "group", ir_group_name(S->split_group));
      if (S->split2_axis >= 0)
        json_object_set_new(js, "then", json_pack("{s:i, s:s}", "axis", S->split2_axis, "group", ir_group_name(S->split2_group)));
      json_object_set_new(jp, "split", js);
    } else {
      json_object_set_new(jp, "split", json_null());
    }
    /* a padded vocabulary (spmd.h): the ranks hold the padded rows (shards of them where split) */
    if (S && S->logical_rows > 0) json_object_set_new(jp, "padded_rows", json_integer(S->full_dims[0]));
    json_t *stage = json_array();
    int same = 1;
    for (int64_t l = 0; l < copies; l++) {
      /* the pipeline stage that holds the owning chunk */
      int s = cp >= 0 && owner[cp][l] >= 0 ? owner[cp][l] % (int)L.pp : 0;
      same &= s == (cp >= 0 && owner[cp][0] >= 0 ? owner[cp][0] % (int)L.pp : 0);
      json_array_append_new(stage, json_integer(s));
    }
    if (same) {
      json_t *first = json_incref(json_array_get(stage, 0));
      json_decref(stage);
      stage = first;
    }
    json_object_set_new(jp, "stage", stage);
    json_object_set_new(jp, "weight_decay", json_boolean(P->rank >= 2 && !P->state));
    if (P->state) json_object_set_new(jp, "state", json_true()); /* running statistics: not trained */
    json_array_append_new(params, jp);
  }
  json_object_set_new(root, "params", params);
  json_object_set_new(root, "compiler",
                      json_pack("{s:s, s:s, s:s, s:b, s:s}", "hpdlc", HPDL_VERSION, "source", C.file, "recompute",
                                sem_recompute_name(L.recompute), "sp", L.sp, "precision", sem_precision_name(m->train.precision)));
  if (m->layout.recompute_layers > 0) /* the policy's layers of each chunk (autodiff.h, ad_build_layers) */
    json_object_set_new(json_object_get(root, "compiler"), "recompute_layers", json_integer(m->layout.recompute_layers));
  json_t *files = json_array();
  if (files_walk(&C, o->out_dir, "", files)) {
    json_decref(files);
    json_decref(root);
    return 1;
  }
  json_object_set_new(root, "files", files);
  snprintf(path, sizeof path, "%s/manifest.json", o->out_dir);
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  int wrc = json_dump_file(root, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(root);
  if (wrc != 0 || rename(tmp, path) != 0) {
    unlink(tmp);
    return cfail(&C, "cannot write %s", path);
  }
  if (!o->quiet && out) {
    char epx[32] = "";
    if (L.ep > 1) snprintf(epx, sizeof epx, " ep=%" PRId64, L.ep);
    fprintf(out, "%s: compiled %s for %s into %s/: %d rank%s (dp=%" PRId64 " tp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64
                 "%s), %" PRId64 " logical parameter tensors, executor %s\n",
            C.file, m->model->decl->name.name, is_cuda(o) ? "cuda" : "cpu", o->out_dir, world, world == 1 ? "" : "s", L.dp, L.tp, L.pp, L.cp, epx, nlogical,
            nnative == K ? (storage16 ? arena_printf(arena, "native (generated kernels, %s storage, fp32 arithmetic%s)", sem_precision_name(m->train.precision),
                                                     params16 ? arena_printf(arena, "; %d weights multiplied from %s copies rounded once per step", params16,
                                                                             sem_precision_name(m->train.precision)) : "")
                                      : "native (generated kernels, fp32)")
            : nnative    ? "mixed (generated kernels where the back end compiles the stage, else the reference executor)"
                         : storage16 ? arena_printf(arena, "interp (the reference executor, fp64, rounding to %s storage)", sem_precision_name(m->train.precision))
                                     : "interp (the reference executor, fp64)");
    for (int c = 0; c < K; c++)
      fprintf(out, "  %s %d: %s %" PRId64 "-%" PRId64 ", %d graphs, %d nodes, arena %" PRId64 " bytes: %s%d.hir%s\n",
              L.vpp > 1 ? "chunk" : "stage", c, pr->by_cuts ? "pieces" : "layers", pr->first[c], pr->first[c] + pr->layers[c] - 1, ch[c].m->ngraphs, ch[c].nnodes,
              ch[c].native && ch[c].plan->fused_arena > 0 ? ch[c].plan->fused_arena : ch[c].plan->arena, fname, c,
              !ch[c].native ? " (interp)"
              : is_cuda(o)  ? arena_printf(arena, ", %s%d.cubin + .ptx (CUDA %s)", fname, c, o->arch ? o->arch : "sm_80")
                            : arena_printf(arena, ", %s%d.so (%s)", fname, c, "native"));
    if (o->fusion_off && nnative)
      fprintf(out, "  fusion off: a kernel an op (every elementwise op and reduction its own kernel, no GEMM epilogues)\n");
    if (packed_moe)
      fprintf(out, "  experts: dropless, each expert's GEMMs over the rows routed to it (grouped; --experts slots: a slot for every token)\n");
    if (slots_moe)
      fprintf(out, "  experts: dropless over a slot for every token in every expert, E / top_k times the routed work (%s)\n",
              o->expert_slots ? "--experts slots" : L.ep > 1 ? "expert parallelism exchanges the slots" : "the layer's slots are read elsewhere");
    if (major_moe)
      fprintf(out, "  experts: slots expert-major under expert parallelism, each expert's GEMMs over every slot the all-to-all brought it\n");
    if (L.cp > 1 && (packed_moe || slots_moe))
      fprintf(out, "  experts: each context rank routes its own tokens (its T / %" PRId64 " of each sequence) into %s of its own\n", L.cp,
              packed_moe ? "rows" : "slots");
    if (L.cp > 1 && dropping_moe)
      fprintf(out,
              "  experts: a layer that drops tokens routes each whole sequence on every context rank (its capacity is the whole "
              "sequence's): cp = %" PRId64 " times its experts' work (docs/compiler.md)\n",
              L.cp);
    if (folded_moe)
      fprintf(out,
              "  experts: whole (expert_tensor = 1), the expert group folded over tensor %" PRId64 " x %" PRId64
              " data-parallel ranks, each tensor rank routing its %s\n",
              L.tp, L.ep / L.tp, L.cp > 1 ? "piece of its context chunk" : "chunk of the sequences");
    if (m->layout.fused_ce == 1) {
      int nfused = 0, shard = 0;
      int64_t rows = 0, vocab = 0;
      for (int gi = 0; gi < pr->m->ngraphs; gi++)
        for (int i = 0; i < pr->m->graphs[gi]->nnodes; i++) {
          const IrGraph *g = pr->m->graphs[gi];
          const IrNode *n = &g->nodes[i];
          if (n->op != IR_LINEAR_CE && n->op != IR_LINEAR_LSE) continue;
          nfused++;
          shard = n->op == IR_LINEAR_LSE;
          rows = ir_numel(n);
          vocab = g->nodes[n->in[1]].dims[n->attr[0] ? 0 : 1];
        }
      if (nfused)
        fprintf(out, "  fused_ce: the head's GEMM and the cross-entropy in blocks (%" PRId64 " rows x %" PRId64
                     " vocabulary%s): the logits, %.1f MB a micro-batch in fp32, are never stored; the backward computes them again\n",
                rows, vocab, shard ? arena_printf(arena, " of a shard, reduced over tensor = %" PRId64, L.tp) : "",
                (double)rows * (double)vocab * 4 / 1e6);
      else
        fprintf(out, "  fused_ce: nothing fused: no cross-entropy reads a head GEMM alone (an untied head split over tensor "
                     "keeps its logits)\n");
    }
    for (int i = 0; i < pr->m->nparams; i++) {
      const IrParam *P = &pr->m->params[i];
      if (P->logical_rows > 0)
        fprintf(out, "  vocabulary: %s's %" PRId64 " rows padded to %" PRId64 " (a multiple of vocab_pad %" PRId64 " x tensor %" PRId64
                     "); the padded logits are masked out of the cross-entropy, checkpoints keep %" PRId64 " rows\n",
                P->name, P->logical_rows, P->full_dims[0], L.vocab_pad, L.tp, P->logical_rows);
    }
  }
  return 0;
}
