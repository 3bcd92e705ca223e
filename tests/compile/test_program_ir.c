/* test_program_ir.c - `hpdlc compile`'s artifact, from the compiler's side
 * (CTest compile.artifact and compile.chunk_file):
 *
 *   artifact    compile_artifact on samples/gpt2-tiny.hpd at tp=2 x pp=2:
 *               the manifest's parameter table (every logical parameter with
 *               its shape, count, split and stages), the ranks' files, and
 *               the chunk files' parameter uses (the tied embedding owned by
 *               stage 0 and mirrored on stage 1, each stage's layers);
 *   chunk_file  the chunk file round-trips: decoding the compiled file and
 *               encoding it again gives the same bytes; the decoded module
 *               prints as the module the passes build, and the reference
 *               executor computes bit-identical loss and gradients on both;
 *               damaged files (truncated, a flipped byte, another version,
 *               not a chunk file, and 2000 random mutations with a valid
 *               checksum) are errors with a message, never a crash. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "program_ir.h"
#include "autodiff.h"
#include "compile.h"
#include "crc32c.h"
#include "interp.h"
#include "loader.h"
#include "lower.h"
#include "pipeline.h"
#include "sema.h"
#include "spmd.h"
#include "test_util.h"

static const char *const defines[] = {"C=32", "T=16", "L=2", "H=4"};

static SemModel *load(Arena *arena, Diag *diag, const char *tp, const char *pp) {
  char path[1024];
  snprintf(path, sizeof path, "%s/samples/gpt2-tiny.hpd", HPDL_SOURCE_DIR);
  LoadedProgram prog = load_program(arena, diag, path);
  SemDefine defs[4], layout[] = {{"parallel.tensor", tp, "--tp"}, {"parallel.pipeline", pp, "--pp"}};
  for (int i = 0; i < 4; i++) {
    const char *eq = strchr(defines[i], '=');
    defs[i] = (SemDefine){arena_strndup(arena, defines[i], (size_t)(eq - defines[i])), eq + 1, NULL};
  }
  int bad = 0;
  SemOptions opts = {defs, 4, layout, 2, NULL, &bad};
  SemModel *m = diag_error_count(diag) ? NULL : sema_check(arena, diag, &prog, &opts);
  EXPECT(m != NULL);
  return m;
}

static char *tmpdir(const char *tag) {
  char *d = malloc(256);
  snprintf(d, 256, "%s/hpdl-compile-%s-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", tag);
  EXPECT(mkdtemp(d) != NULL);
  return d;
}

static void rmtree(const char *d) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
  EXPECT(system(cmd) == 0);
}

static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)n + 1);
  *len = fread(b, 1, (size_t)n, f);
  fclose(f);
  return b;
}

static int compile_to(const char *dir, const char *tp, const char *pp, CompileExecutor ex) {
  Arena *arena = arena_new();
  Diag *diag = diag_new(stderr);
  SemModel *m = load(arena, diag, tp, pp);
  CompileOptions o = {dir, "cpu", ex, NULL, "gpt2-tiny.hpd", 1, NULL, 0, 0, 0, PROGRESS_QUIET, 0, 0, 0};
  o.program_lib = HPDL_PROGRAM_LIB;
  int rc = m ? compile_artifact(arena, diag, m, &o, stdout, stderr) : 1;
  diag_free(diag);
  arena_free(arena);
  return rc;
}

static const ProgramUse *find_use(const ProgramChunk *c, const char *name, int64_t layer) {
  for (int i = 0; i < c->nuses; i++)
    if (!strcmp(c->m->params[c->uses[i].param].name, name) && c->uses[i].layer == layer) return &c->uses[i];
  return NULL;
}

static void test_artifact(void) {
  char *dir = tmpdir("artifact");
  EXPECT(compile_to(dir, "2", "2", COMPILE_EXEC_INTERP) == 0);
  char path[512];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  json_error_t je;
  json_t *man = json_load_file(path, 0, &je);
  EXPECT(man != NULL);
  if (!man) return;
  EXPECT(json_integer_value(json_object_get(man, "world_size")) == 4);
  EXPECT_STR(json_string_value(json_object_get(json_object_get(man, "program"), "executor")), "interp");
  json_t *ranks = json_object_get(man, "ranks");
  EXPECT(json_array_size(ranks) == 4);
  for (size_t r = 0; r < json_array_size(ranks); r++) {
    json_t *jr = json_array_get(ranks, r);
    char want[32];
    snprintf(want, sizeof want, "stage%zu.hir", r / 2); /* tp innermost: ranks 0, 1 are stage 0 */
    EXPECT_STR(json_string_value(json_object_get(jr, "module")), want);
    EXPECT_STR(json_string_value(json_object_get(jr, "program")), "program.so");
    EXPECT(json_integer_value(json_object_get(jr, "arena_bytes")) > 0);
  }
  /* 2 embeddings, 16 tensors per block, the final norm's 2 */
  json_t *params = json_object_get(man, "params");
  EXPECT(json_array_size(params) == 20);
  int seen = 0;
  for (size_t i = 0; i < json_array_size(params); i++) {
    json_t *p = json_array_get(params, i);
    const char *name = json_string_value(json_object_get(p, "name"));
    json_t *shape = json_object_get(p, "shape"), *split = json_object_get(p, "split"), *stage = json_object_get(p, "stage");
    if (!strcmp(name, "wte.weight")) {
      seen++;
      EXPECT(json_integer_value(json_array_get(shape, 0)) == 256 && json_integer_value(json_array_get(shape, 1)) == 32);
      EXPECT(json_integer_value(json_object_get(split, "axis")) == 0);
      EXPECT_STR(json_string_value(json_object_get(split, "group")), "tp");
      EXPECT(json_is_integer(stage) && json_integer_value(stage) == 0);
      EXPECT_STR(json_string_value(json_object_get(json_object_get(p, "init"), "kind")), "normal");
    } else if (!strcmp(name, "blocks.{i}.attn.q_proj.weight")) {
      seen++;
      EXPECT(json_integer_value(json_object_get(p, "count")) == 2);
      EXPECT(json_integer_value(json_object_get(split, "axis")) == 1); /* column parallel */
      EXPECT(json_is_array(stage) && json_integer_value(json_array_get(stage, 0)) == 0 &&
             json_integer_value(json_array_get(stage, 1)) == 1);
    } else if (!strcmp(name, "ln_f.weight")) {
      seen++;
      EXPECT(json_is_null(split));
      EXPECT(json_integer_value(stage) == 1);
      EXPECT_STR(json_string_value(json_object_get(json_object_get(p, "init"), "kind")), "ones");
    } else if (!strcmp(name, "wpe.weight")) {
      seen++;
      EXPECT(json_is_null(split)); /* split = replicated */
    }
  }
  EXPECT(seen == 4);
  json_decref(man);
  /* the chunks' parameter uses */
  Arena *arena = arena_new();
  char err[512];
  snprintf(path, sizeof path, "%s/stage0.hir", dir);
  ProgramChunk *c0 = program_ir_read(arena, path, err, sizeof err);
  snprintf(path, sizeof path, "%s/stage1.hir", dir);
  ProgramChunk *c1 = program_ir_read(arena, path, err, sizeof err);
  EXPECT(c0 && c1);
  if (c0 && c1) {
    EXPECT(c0->chunk == 0 && c1->chunk == 1 && c0->nchunks == 2);
    const ProgramUse *u0 = find_use(c0, "wte.weight", 0), *u1 = find_use(c1, "wte.weight", 0);
    EXPECT(u0 && u0->owner == 0 && u0->nmirrors == 1 && u0->mirrors[0] == 1);
    EXPECT(u1 && u1->owner == 0 && u1->nmirrors == 0);
    EXPECT(find_use(c0, "blocks.{i}.ln1.weight", 0) && !find_use(c0, "blocks.{i}.ln1.weight", 1));
    EXPECT(find_use(c1, "blocks.{i}.ln1.weight", 1) && !find_use(c1, "blocks.{i}.ln1.weight", 0));
    EXPECT(find_use(c1, "ln_f.weight", 0) && !find_use(c0, "ln_f.weight", 0));
    EXPECT(find_use(c0, "wpe.weight", 0) && !find_use(c1, "wpe.weight", 0));
    EXPECT(c0->feed[0] == PROGRAM_FEED_TOKENS && c0->feed[1] == PROGRAM_FEED_TARGETS);
  } else {
    fprintf(stderr, "%s\n", err);
  }
  arena_free(arena);
  rmtree(dir);
  free(dir);
}

static char *print_module(const IrModule *m) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ir_print(m, f);
  fclose(f);
  return buf;
}

/* Loss and every gradient of one training step, fp64 bits. */
static double run_step(const ProgramChunk *c, double *grads_out, int64_t ngrads) {
  Interp *in = interp_new(c->m);
  interp_init_params(in, 99);
  double *x[2];
  for (int i = 0; i < 2; i++) {
    int64_t n = c->m->inputs[i].dims[0] * c->m->inputs[i].dims[1];
    x[i] = malloc(sizeof(double) * (size_t)n);
    for (int64_t k = 0; k < n; k++) x[i][k] = (double)((k * 37 + i * 11) % 256);
    interp_set_input(in, i, x[i]);
  }
  AdResult ad;
  memset(&ad, 0, sizeof ad);
  ad.m = c->m;
  ad.step = c->step;
  const char *why = NULL;
  double loss = ad_step(in, &ad, 1.0, &why);
  int64_t k = 0;
  for (int p = 0; p < c->m->nparams; p++)
    for (int64_t l = 0; l < (c->m->params[p].count > 1 ? c->m->params[p].count : 1); l++) {
      int64_t n = 0;
      const double *g = interp_grad(in, p, l, &n);
      for (int64_t j = 0; g && j < n && k < ngrads; j++) grads_out[k++] = g[j];
    }
  for (int i = 0; i < 2; i++) free(x[i]);
  interp_free(in);
  return loss;
}

static void test_chunk_file(void) {
  char *dir = tmpdir("chunk");
  EXPECT(compile_to(dir, "1", "1", COMPILE_EXEC_INTERP) == 0);
  char path[512], err[512];
  snprintf(path, sizeof path, "%s/stage0.hir", dir);
  size_t len = 0;
  unsigned char *bytes = slurp(path, &len);
  EXPECT(bytes && len > 100);
  if (!bytes) return;
  Arena *arena = arena_new();
  ProgramChunk *c = program_ir_decode(arena, bytes, len, err, sizeof err);
  EXPECT(c != NULL);
  if (!c) {
    fprintf(stderr, "%s\n", err);
    return;
  }
  /* decode -> encode gives the file back, byte for byte */
  size_t len2 = 0;
  unsigned char *again = program_ir_encode(c, &len2);
  EXPECT(again && len2 == len && memcmp(again, bytes, len) == 0);
  free(again);
  /* the decoded module is the module the passes build */
  Diag *diag = diag_new(stderr);
  SemModel *m = load(arena, diag, "1", "1");
  IrModule *g = lower_model(arena, diag, m, m->train.micro_batch);
  SpmdSpec spec = {1, 1, 0, m->seq_len, 1, 0, 0, 0, 0};
  PipeResult *pr = pipe_split(arena, diag, spmd_partition(arena, diag, g, &spec), 1, NULL);
  IrModule *cm = pipe_chunk_module(arena, pr, 0);
  const char *why = NULL;
  AdResult *ad = ad_build(cm, RECOMPUTE_NONE, &why);
  EXPECT(ad != NULL);
  char *want = print_module(cm), *got = print_module(c->m);
  EXPECT(strcmp(want, got) == 0);
  free(want);
  free(got);
  ProgramChunk orig = *c;
  orig.m = cm;
  orig.step = ad->step;
  int64_t ng = 0;
  for (int p = 0; p < cm->nparams; p++) {
    int64_t n = 1;
    for (int k = 0; k < cm->params[p].rank; k++) n *= cm->params[p].dims[k];
    ng += n * (cm->params[p].count > 1 ? cm->params[p].count : 1);
  }
  double *ga = calloc((size_t)ng, sizeof(double)), *gb = calloc((size_t)ng, sizeof(double));
  double la = run_step(&orig, ga, ng), lb = run_step(c, gb, ng);
  EXPECT(memcmp(&la, &lb, sizeof la) == 0 && la > 0);
  EXPECT(memcmp(ga, gb, sizeof(double) * (size_t)ng) == 0);
  printf("chunk file: %zu bytes, %d graphs; step loss %.17g on both\n", len, c->m->ngraphs, la);
  free(ga);
  free(gb);

  /* damaged files */
  unsigned char *d = malloc(len);
  memcpy(d, bytes, len);
  EXPECT(program_ir_decode(arena, d, len - 1, err, sizeof err) == NULL && strstr(err, "truncated"));
  d[len / 2] ^= 0x10;
  EXPECT(program_ir_decode(arena, d, len, err, sizeof err) == NULL && strstr(err, "corrupted") && strstr(err, "CRC-32C"));
  memcpy(d, bytes, len);
  d[8] = 99;
  EXPECT(program_ir_decode(arena, d, len, err, sizeof err) == NULL && strstr(err, "version 99"));
  memcpy(d, bytes, len);
  d[0] = 'X';
  EXPECT(program_ir_decode(arena, d, len, err, sizeof err) == NULL && strstr(err, "not an hpdl chunk file"));
  EXPECT(program_ir_read(arena, "/nonexistent/stage0.hir", err, sizeof err) == NULL && strstr(err, "/nonexistent/stage0.hir"));
  /* mutations past the checksum: each decodes to a verifying module or fails
   * with a message; the sanitizer build catches any stray access */
  uint64_t s = 12345;
  int failed = 0, decoded = 0;
  for (int t = 0; t < 2000; t++) {
    memcpy(d, bytes, len);
    int nflip = 1 + t % 3;
    for (int k = 0; k < nflip; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      size_t at = 28 + (size_t)((s >> 33) % (len - 28));
      d[at] = (unsigned char)(s >> 13);
    }
    uint32_t crc = crc32c_update(0, d + 28, len - 28);
    memcpy(d + 24, &crc, 4);
    Arena *ta = arena_new();
    err[0] = 0;
    if (program_ir_decode(ta, d, len, err, sizeof err)) decoded++;
    else {
      failed++;
      EXPECT(err[0] != 0);
    }
    arena_free(ta);
  }
  printf("mutations: %d rejected with a message, %d still decode (a changed value, not structure)\n", failed, decoded);
  free(d);
  free(bytes);
  diag_free(diag);
  arena_free(arena);
  rmtree(dir);
  free(dir);
}

int main(int argc, char **argv) {
  const char *part = argc > 1 ? argv[1] : "all";
  if (!strcmp(part, "artifact") || !strcmp(part, "all")) test_artifact();
  if (!strcmp(part, "chunk_file") || !strcmp(part, "all")) test_chunk_file();
  TEST_DONE();
}
