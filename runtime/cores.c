/* cores.c - BLAS threads per rank (see cores.h). */
#define _GNU_SOURCE /* RTLD_DEFAULT, RTLD_NOLOAD */
#include "cores.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* A positive thread count, or 0 for unset, empty or not a number (which
 * OpenBLAS also ignores). */
static int env_threads(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) return 0;
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno || *end || n < 1 || n > 1 << 16) return 0;
  return (int)n;
}

CoresChoice cores_choose(int threads_option, int node_ranks) {
  CoresChoice c = {0};
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  c.cores = cores > 0 ? (int)cores : 1;
  c.node_ranks = node_ranks > 0 ? node_ranks : 1;
  if (threads_option > 0) {
    c.threads = threads_option;
    c.source = CORES_OPTION;
    return c;
  }
  /* OpenBLAS reads OPENBLAS_NUM_THREADS first, then OMP_NUM_THREADS */
  const char *vars[] = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"};
  for (int i = 0; i < 2; i++) {
    int n = env_threads(vars[i]);
    if (n > 0) {
      c.threads = n;
      c.source = CORES_ENV;
      c.env = vars[i];
      return c;
    }
  }
  c.threads = c.cores / c.node_ranks;
  if (c.threads < 1) c.threads = 1;
  c.source = CORES_AUTO;
  return c;
}

typedef void (*SetThreadsFn)(int);

void cores_apply(const CoresChoice *c) {
  if (c->source != CORES_ENV) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", c->threads);
    setenv("OPENBLAS_NUM_THREADS", buf, 1);
    setenv("OMP_NUM_THREADS", buf, 1);
  }
  /* OpenBLAS's idle threads spin (sched_yield) for 2^28 cycles after each
   * call, about 0.1 s: through a whole step, so the rank's own threads (the
   * kernels' rows, the optimizer) share their cores with them and gain
   * nothing. 2^20 cycles (about 0.4 ms) keeps them spinning between GEMMs
   * a short kernel apart and asleep through longer work; measured on GPT-2
   * 124M (docs/runtime.md, "Speed on the CPU"). A user's setting stays. */
  setenv("OPENBLAS_THREAD_TIMEOUT", CORES_BLAS_TIMEOUT, 0);
  /* An OpenBLAS already loaded (linked in, preloaded) has read the
   * environment at its start: tell it directly. */
  SetThreadsFn set = NULL;
  *(void **)&set = dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
  void *lib = NULL;
  if (!set && (lib = dlopen("libopenblas.so.0", RTLD_LAZY | RTLD_NOLOAD)) != NULL)
    *(void **)&set = dlsym(lib, "openblas_set_num_threads");
  if (set) set(c->threads);
  if (lib) dlclose(lib);
}

void cores_describe(const CoresChoice *c, char *buf, int n) {
  int k = snprintf(buf, (size_t)n, "%d thread%s per rank", c->threads, c->threads == 1 ? "" : "s");
  if (k < 0 || k >= n) return;
  if (c->source == CORES_OPTION) snprintf(buf + k, (size_t)(n - k), " (--threads)");
  else if (c->source == CORES_ENV) snprintf(buf + k, (size_t)(n - k), " (%s)", c->env);
}
