/* test_model.h - loads a sample for the unit tests: checked with the given
 * -D overrides, on one rank of the cpu cluster, micro batch 2 (the layouts
 * under test come from the tests themselves, not the file's parallel block). */
#ifndef HPDL_TEST_MODEL_H
#define HPDL_TEST_MODEL_H

#include <stdio.h>
#include <string.h>

#include "loader.h"
#include "sema.h"
#include "test_util.h"

typedef struct {
  Arena *arena;
  Diag *diag;
  SemModel *model;
} Loaded;

static SemModel *load(Loaded *L, const char *file, const char *const *defs, int ndefs) {
  memset(L, 0, sizeof *L);
  L->arena = arena_new();
  L->diag = diag_new(stderr);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", HPDL_SOURCE_DIR, file);
  LoadedProgram prog = load_program(L->arena, L->diag, path);
  enum { MAX_DEFINES = 32 };
  SemDefine defines[MAX_DEFINES], layout[] = {
      {"parallel.cluster", "cpu", NULL}, {"parallel.data", "1", NULL}, {"parallel.tensor", "1", NULL},
      {"parallel.pipeline", "1", NULL}, {"parallel.context", "1", NULL}, {"parallel.virtual", "1", NULL},
      {"parallel.schedule", "1f1b", NULL}, {"parallel.nodes", "1", NULL}, {"parallel.gpus_per_node", "1", NULL},
      {"parallel.expert", "1", NULL}, {"train.micro_batch", "2", NULL}, {"train.batch", "2", NULL}};
  int nd = 0;
  if (ndefs > MAX_DEFINES) { /* a test's list outgrew the array: say so rather than write past it */
    fprintf(stderr, "test_model.h: %d defines for %s, at most %d\n", ndefs, file, MAX_DEFINES);
    EXPECT(ndefs <= MAX_DEFINES);
    ndefs = MAX_DEFINES;
  }
  for (int i = 0; i < ndefs; i++) {
    const char *eq = strchr(defs[i], '=');
    defines[nd].name = arena_strndup(L->arena, defs[i], (size_t)(eq - defs[i]));
    defines[nd].value = eq + 1;
    defines[nd++].flag = NULL;
  }
  int bad = 0;
  SemOptions opts = {defines, nd, layout, (int)(sizeof layout / sizeof layout[0]), NULL, &bad};
  L->model = diag_error_count(L->diag) ? NULL : sema_check(L->arena, L->diag, &prog, &opts);
  EXPECT(L->model != NULL);
  return L->model;
}

static void unload(Loaded *L) {
  diag_free(L->diag);
  arena_free(L->arena);
}

#endif
