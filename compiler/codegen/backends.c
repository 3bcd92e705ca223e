/* backends.c - the registry of back ends (cg_backend, codegen.h): the one
 * file that knows which are built in. Apart from codegen.c, which the back
 * ends themselves use, so that no back end and the registry include each
 * other. */
#include <string.h>

#include "codegen.h"

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
