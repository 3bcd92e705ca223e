/* program_shim.c - the one definition of the compiler's front end that the
 * IR and the reference executor use besides compiler/semtypes.c: "no source
 * location" (diag.c's), for the CPU program (program_exec.c), which carries
 * ir.c and interp.c but not the front end. */
#include "sema.h"

/* "No location" (diag.c's): nodes the executor never reports by source span. */
const Span span_none = {-1, 0, 0, 0, 0};
