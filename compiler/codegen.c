/* codegen.c - the registry of back ends and the entry points' symbols. */
#include "codegen.h"

#include <string.h>

#ifdef HPDL_HAVE_LLVM
#include "codegen_cpu.h"
#endif

const CgBackend *cg_backend(const char *name) {
#ifdef HPDL_HAVE_LLVM
  if (name && !strcmp(name, "cpu")) return cg_cpu_backend();
#else
  (void)name;
#endif
  return NULL;
}

size_t cg_graph_symbol(const char *name, char *buf, size_t n) {
  static const char prefix[] = "hpd_graph_";
  size_t k = 0;
  for (const char *p = prefix; *p && k + 1 < n; p++) buf[k++] = *p;
  for (const char *p = name; *p && k + 1 < n; p++) {
    char c = *p;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    buf[k++] = ok ? c : '_';
  }
  if (n) buf[k] = '\0';
  return k;
}
