/* program_ir.h - one pipeline chunk's training step as a file: the
 * differentiated IR module that `hpdlc compile` writes into the artifact
 * (DIR/stageS.hir) and the CPU program (program_exec.c) reads back.
 *
 * The file is the compiler's IrModule (ir.h) after partitioning, pipeline
 * splitting and autodiff, plus what a rank needs to run it: which graph is
 * the step, which model input the data loader's inputs and targets feed,
 * and, for every parameter copy the chunk reads, the pipeline stage that
 * holds it (a tied embedding is read by the first and the last stage; the
 * runtime keeps it on one, and the program mirrors it to the other).
 *
 * Format, version 7, all integers little-endian (docs/runtime.md, "The
 * chunk file"):
 *
 *   header   "HPDL-IR\n" (8 bytes), u32 version, u32 flags (0),
 *            u64 payload bytes, u32 CRC-32C of the payload
 *   payload  i32 chunk, nchunks, step graph, nforward, recompute
 *            i64 micro_batch
 *            u32 ninputs  { str name, u8 dtype, u8 rank, i64 dims[rank], u8 feed }
 *            u32 nparams  { str name, u8 dtype, u8 rank, i64 dims[rank], u8 init kind,
 *                           f64 a, f64 b, u8 shard, i32 graph, i64 count,
 *                           i64 full_dims[rank], i32 split_axis, u8 split_group,
 *                           i32 split2_axis, u8 split2_group, u8 state, i64 logical_rows }
 *            u32 nexterns { str name, str where, str library, str path, str symbol, str grad,
 *                           u32 nargs { u8 rank, i64 dims[rank] }, u8 rank, i64 dims[rank],
 *                           u32 ndims, i64 dims[ndims] }
 *              (IrModule.externs; path: "extern/NAME" for a library hpdlc compile copied
 *              into the artifact, relative to its folder; a bare name for the dlopen
 *              search path; an empty grad is none)
 *            u32 ngraphs  { str name, i32 nargs, i64 count, i32 fb_split,
 *                           u32 nnodes { u8 op, u8 dtype, u8 rank, i64 dims[rank],
 *                                        u32 nin, i32 in[nin], u8 nattr, i64 attr[nattr],
 *                                        f64 fattr, str name },
 *                           u32 noutputs, i32 outputs[], u32 ngrad, i32 grad_params[] }
 *            u32 nuses    { i32 param, i64 layer, i32 owner, u32 nmirrors, i32 mirrors[] }
 *            i32 schedule, m, v   (the pipeline schedule: semtypes.h's Schedule,
 *                                  micro-batches, chunks per pipeline rank)
 *            u32 ninstr   { u8 op, i32 chunk, i32 mb, i32 peer }  this rank's
 *                                  instruction list (schedule.h's SchedInstr)
 *   str: u32 length, then the bytes (no NUL); an empty node name is none.
 *   f64: IEEE 754 binary64, so constants round-trip exactly.
 *
 * Ops and dtypes are stored by their index in ir_ops.h / semtypes.h's tables:
 * a file is read by the hpdlc that wrote it (the version is bumped when
 * those tables change). The reader checks every count and index against
 * the bytes left and the tables, so a damaged file is an error message,
 * never a crash; the checksum catches what those checks cannot. */
#ifndef HPDL_PROGRAM_IR_H
#define HPDL_PROGRAM_IR_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "ir.h"
#include "schedule.h"
#include "semtypes.h"

enum { PROGRAM_IR_VERSION = 7 }; /* 2: the extern table; 3: the forward/backward cut and the instruction list;
                                     4: the source files and each node's line; 5: a parameter's second split;
                                     6: a parameter's state flag (running statistics);
                                     7: VOCAB_MASK in the op table, a parameter's logical rows
                                        (vocabulary padding) */
#define PROGRAM_IR_MAGIC "HPDL-IR\n"

/* What the runtime's data loader puts into a model input: a token
 * window's inputs or targets (i32 [B, T]), or an image file's pixels
 * (f32 [B, ...], pixel / 255 - 0.5) or labels (i32 [B]). Stored as the u8
 * `feed` of an input; images and labels came after version 5's first files,
 * whose readers refuse them as unknown feeds. */
typedef enum { PROGRAM_FEED_TOKENS, PROGRAM_FEED_TARGETS, PROGRAM_FEED_IMAGES, PROGRAM_FEED_LABELS } ProgramFeed;

/* A parameter copy the chunk reads. */
typedef struct {
  int param;      /* index into the module's params */
  int64_t layer;  /* the copy (0 for a parameter outside a repeat) */
  int owner;      /* the chunk that holds it: the TrainTensor is on its pipeline stage (owner % pp) */
  int nmirrors;   /* on the owner's chunk: the other chunks that read it too */
  int *mirrors;
} ProgramUse;

typedef struct {
  IrModule *m;      /* graph 0 the chunk's forward, then the block graphs, then autodiff's */
  int chunk, nchunks;
  int step;         /* the training step graph (autodiff.h: forward.grad) */
  int nforward;     /* graphs 0..nforward-1 are the forward module */
  Recompute recompute;
  ProgramFeed *feed; /* per model input */
  ProgramUse *uses;  /* ascending (param, layer) */
  int nuses;
  /* The pipeline schedule the rank holding this chunk runs (schedule.h),
   * for sched_m micro-batches per step and sched_v chunks per rank, and
   * that rank's instruction list (the same in each of its chunks' files).
   * nins 0: none recorded; the runtime builds it. */
  Schedule schedule;
  int sched_m, sched_v;
  SchedInstr *ins;
  int nins;
} ProgramChunk;

/* The file's bytes; *len its length. NULL when memory runs out. Free with free(). */
unsigned char *program_ir_encode(const ProgramChunk *c, size_t *len);
/* Writes the file (a temporary, then rename). 0, or -1 with the reason in err. */
int program_ir_write(const ProgramChunk *c, const char *path, char *err, size_t errlen);

/* Decodes a file's bytes into `arena`. NULL with the reason (and the byte
 * offset at fault) in err. */
ProgramChunk *program_ir_decode(Arena *arena, const unsigned char *buf, size_t len, char *err, size_t errlen);
/* Reads and decodes path; errors name it. */
ProgramChunk *program_ir_read(Arena *arena, const char *path, char *err, size_t errlen);

#endif
