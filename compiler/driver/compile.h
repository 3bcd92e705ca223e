/* compile.h - `hpdlc compile FILE --target cpu -o DIR`: the artifact the
 * runtime runs (docs/runtime.md, "The artifact").
 *
 * From the checked model: lower at the train block's micro batch ->
 * spmd_partition over tensor / sequence / context parallelism -> pipe_split
 * into one chunk per pipeline stage -> per chunk pipe_chunk_module and
 * ad_build with the layout's recompute policy (the training step of
 * autodiff.h) -> the static memory plan (memplan.h, with the fusion of
 * fuse.h: each rank's arena_bytes) -> with the CPU back end built
 * (codegen.h), the chunk's kernels as a shared library. Written into DIR:
 *
 *   manifest.json   the runtime's schema (version 1): model, layout, inputs,
 *                   train block, program {kind "native", executor}, one entry
 *                   per rank {program, arena_bytes, module, kernels}, and every
 *                   logical parameter {name, shape, count, init, split, stage}
 *   program.so      the CPU program every rank loads (runtime/program_exec.c)
 *   stageS.hir      pipeline stage S's differentiated chunk (core/program_ir.h)
 *   stageS.so       its generated kernels (executor native only)
 *
 * Ranks of one stage share its files: they differ only in their coordinates,
 * which the program reads from the runtime's Comm. Nothing else is needed
 * at run time: not the compiler, not the source tree. */
#ifndef HPDL_COMPILE_H
#define HPDL_COMPILE_H

#include <stdio.h>

#include "progress.h"
#include "arena.h"
#include "diag.h"
#include "sema.h"

typedef enum {
  COMPILE_EXEC_AUTO,   /* native when the CPU back end is built and compiles every chunk, else interp */
  COMPILE_EXEC_NATIVE, /* the back end's kernels (fp32); an error when it cannot */
  COMPILE_EXEC_INTERP  /* the reference executor (fp64), no kernels */
} CompileExecutor;

typedef struct {
  const char *out_dir;      /* DIR (created when missing) */
  const char *target;       /* "cpu" or "cuda" (NULL: cpu) */
  CompileExecutor executor;
  const char *program_lib;  /* the CPU program to copy; NULL: $HPDL_PROGRAM_LIB, else
                               ../lib/hpdl-program.so beside the hpdlc executable */
  const char *source;       /* the .hpd path, recorded in the manifest */
  int quiet;                /* no summary on `out` */
  const char *arch;         /* cuda: "sm_80" (NULL), "sm_90", "sm_100", ... */
  int verbose;              /* -v: per kernel resources and launch shapes */
  int emulate;              /* cuda: also stageS.emu.so, the kernels for hpdlrun --device emulate */
  int allow_native;         /* --allow-native: an extern's library may be loaded (it runs native code) */
  ProgressMode progress;    /* --progress, on stderr (core/progress.h) */
  int materialize_attention; /* --attention materialized (lower.h's LowerOptions) */
  int expert_slots;         /* --experts slots: dropless experts left over their slots (moepack.h) */
  int fusion_off;           /* --fusion off: a kernel an op (fuse.h's eager options) */
} CompileOptions;

/* "auto", "native", "interp"; -1 when unknown. */
int compile_executor_parse(const char *s);

/* Compiles the checked model into o->out_dir. Returns an exit status: 0, 1
 * (the model or layout cannot be compiled, or a file cannot be written: a
 * message on `err` or in diag), 3 (an internal error: a pass's output does
 * not verify). A summary goes to `out` unless o->quiet. */
int compile_artifact(Arena *arena, Diag *diag, const SemModel *m, const CompileOptions *o, FILE *out, FILE *err);

#endif
