/* program_shim.c - the few definitions of the compiler's front end that the
 * IR and the reference executor use (element types, shard names, "no source
 * location"), for the CPU program (program_exec.c), which carries ir.c and
 * interp.c but not the front end. The element types come from sema.h's own
 * table (the SEM_DTYPES X-macro), so they cannot drift from sema.c's; hpdlc
 * itself links sema.c and diag.c instead. */
#include "sema.h"

static const char *const dtype_names[] = {
#define X(id, name, bytes, is_float) name,
    SEM_DTYPES(X)
#undef X
};
static const int dtype_bytes[] = {
#define X(id, name, bytes, is_float) bytes,
    SEM_DTYPES(X)
#undef X
};
static const int dtype_float[] = {
#define X(id, name, bytes, is_float) is_float,
    SEM_DTYPES(X)
#undef X
};

const char *sem_dtype_name(DType t) { return dtype_names[t]; }
int sem_dtype_bytes(DType t) { return dtype_bytes[t]; }
int sem_dtype_is_float(DType t) { return dtype_float[t]; }

const char *sem_shard_name(ShardKind k) {
  static const char *const n[] = {"replicated", "column", "row", "vocab"};
  return n[k];
}

/* "No location" (diag.c's): nodes the executor never reports by source span. */
const Span span_none = {-1, 0, 0, 0, 0};
