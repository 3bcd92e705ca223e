/* backends.c - the registry of back ends (cg_backend, codegen.h): the one
 * file that knows which are built in. Apart from codegen.c, which the back
 * ends themselves use, so that no back end and the registry include each
 * other. */
#include <string.h>

#include "codegen.h"
#include "codegen_cuda.h"

#ifdef HPDL_HAVE_LLVM
#include "codegen_cpu.h"
#endif

const CgBackend *cg_backend(const char *name) {
  if (!name) return NULL;
#ifdef HPDL_HAVE_LLVM
  if (!strcmp(name, "cpu")) return cg_cpu_backend();
#endif
  if (!strcmp(name, "cuda")) return cg_cuda_backend();
  return NULL;
}
