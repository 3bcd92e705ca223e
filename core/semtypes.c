/* semtypes.c - the names and sizes of semtypes.h's types. */
#include "semtypes.h"

#include <string.h>

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
  static const char *const n[] = {"replicated", "column", "row", "vocab", "expert_column", "expert_row"};
  return n[k];
}

const char *sem_schedule_name(Schedule s) {
  static const char *const n[] = {"gpipe", "1f1b", "interleaved"};
  return n[s];
}

const char *const sem_compression_names[] = {"none", "fp16", "int8", "topk", "bf16", NULL};

const char *sem_compression_name(Compression c) { return sem_compression_names[c]; }

int sem_compression_parse(const char *s) {
  for (int i = 0; sem_compression_names[i]; i++)
    if (!strcmp(s, sem_compression_names[i])) return i;
  return -1;
}

const char *sem_recompute_name(Recompute r) {
  static const char *const n[] = {"none", "selective", "full", "ops", "act"};
  return n[r];
}

const char *sem_precision_name(Precision p) {
  static const char *const n[] = {"fp32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4"};
  return n[p];
}

int sem_precision_priced_only(Precision p) { return p == PREC_FP8 || p == PREC_MXFP8 || p == PREC_NVFP4; }
