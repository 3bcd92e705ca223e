/* codegen.c - what every back end shares: the entry points' symbols. The
 * registry of back ends is backends.c. */
#include "codegen.h"

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
