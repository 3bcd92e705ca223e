/* fuzz_cluster.c - libFuzzer target for cluster files: a `cluster` block of
 * a .hpd file (compiler/front/sema_blocks.c: sema_read_cluster_decl) and
 * what the planner (compiler/plan/) makes of its figures.
 *
 * The input is a cluster file such as samples/clusters/dgx-h100.hpd. It is
 * written to a scratch folder as cluster.hpd beside a fixed model that
 * imports it, as a user's model imports a cluster file; the model is loaded
 * and checked with `--cluster NAME --gpus 16` (NAME: the first cluster the
 * input declares), and planned as `hpdlc plan` plans it: the text and JSON
 * reports, a scaling study and a trace, all into /dev/null. Diagnostics are
 * fine; a crash, a sanitizer report, a leak or a hang is a bug. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "fuzz_util.h"
#include "loader.h"
#include "plan.h"
#include "sema.h"

/* Small enough to plan quickly; a repeat so that it has pipeline stages and
 * tensor-parallel collectives, priced on the cluster's links. */
static const char model_text[] =
    "import \"std/nn\"\n"
    "import \"cluster\"\n"
    "model Tiny(V = 64, T = 16, C = 16, L = 2, H = 2) {\n"
    "  input tokens : i32[B, T]\n"
    "  input targets : i32[B, T]\n"
    "  wte = Embedding(V, C)\n"
    "  wpe = Embedding(T, C, split = replicated)\n"
    "  blocks = repeat L TransformerBlock(C, H, ffn = 4 * C, act = gelu, layers = L)\n"
    "  ln_f = LayerNorm(C)\n"
    "  forward {\n"
    "    x = wte(tokens) + wpe(arange(T))\n"
    "    logits = ln_f(blocks(x)) @ transpose(wte.weight)\n"
    "    loss = cross_entropy(logits, targets)\n"
    "  }\n"
    "}\n"
    "train { batch = 64  micro_batch = 4  optimizer = adamw(lr = 1e-3) }\n"
    "parallel { tensor = 2  pipeline = 2 }\n";

static FILE *devnull(void) {
  static FILE *f;
  if (!f && !(f = fopen("/dev/null", "w"))) abort();
  return f;
}

/* The first cluster the file at `path` declares, or NULL. */
static const char *first_cluster(const LoadedProgram *prog, const char *path) {
  for (int i = 0; i < prog->nfiles; i++) {
    const AstFile *f = prog->files[i];
    if (!f || !f->path || strcmp(f->path, path)) continue;
    for (int d = 0; d < f->ndecls; d++)
      if (f->decls[d]->kind == DECL_CLUSTER && f->decls[d]->name.name) return f->decls[d]->name.name;
  }
  return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char model_path[4096];
  char cluster_path[4096];
  if (!model_path[0]) fuzz_write("model.hpd", model_text, sizeof model_text - 1, model_path);
  fuzz_write("cluster.hpd", data, size, cluster_path);

  Arena *arena = arena_new();
  char *said = NULL; /* the replay keeps the diagnostics as notes */
  size_t said_len = 0;
  FILE *out = fuzz_verbose ? open_memstream(&said, &said_len) : devnull();
  if (!out) abort();
  Diag *diag = diag_new(out);
  LoadedProgram prog = load_program(arena, diag, model_path);
  const char *name = first_cluster(&prog, cluster_path);
  if (diag_error_count(diag) == 0 && name) {
    /* 16 devices whatever the cluster's node size: enough to plan with tp = 2, pp = 2,
     * and across nodes when a node holds fewer */
    SemDefine layout[] = {{"parallel.cluster", name, "--cluster"}, {"parallel.gpus", "16", "--gpus"}};
    int bad_cli = 0;
    SemOptions opts = {NULL, 0, layout, 2, NULL, &bad_cli};
    SemModel *m = sema_check(arena, diag, &prog, &opts);
    if (m && diag_error_count(diag) == 0) {
      PlanCliOptions o;
      memset(&o, 0, sizeof o);
      o.output = "/dev/null";
      o.trace = "/dev/null";
      o.scaling = "4,8,32";
      int status = plan_command(diag, model_path, m, &o);
      o.format = "json";
      o.trace = NULL;
      o.scaling = NULL;
      status |= plan_command(diag, model_path, m, &o) << 1;
      fuzz_note("cluster %s: planned (status %d)", name, status);
    }
  }
  fuzz_note("%d error%s", diag_error_count(diag), diag_error_count(diag) == 1 ? "" : "s");
  diag_free(diag);
  if (out != devnull()) {
    fclose(out);
    fuzz_note("%s", said);
    free(said);
  }
  arena_free(arena);
  return 0;
}
