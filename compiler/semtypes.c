/* semtypes.c - the element-type and sharding tables of sema.h.
 *
 * Kept apart from sema.c because the CPU program library (runtime/
 * program_exec.c) carries the IR and the reference executor, which need
 * these, but not the front end. */
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

/* Here rather than in sema.c: schedule.c uses it, and the CPU program
 * (runtime/program_exec.c) carries schedule.c without the front end. */
const char *sem_schedule_name(Schedule s) {
  static const char *const n[] = {"gpipe", "1f1b", "interleaved"};
  return n[s];
}
