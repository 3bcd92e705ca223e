/* pipeline.h - splits a module into pipeline model chunks.
 *
 * Graph 0 must have the form `prologue; y = call Block x L; epilogue`:
 * the repeated blocks are what a pipeline divides. With p stages and v
 * virtual stages there are K = p * v chunks of L / K layers each; chunk c
 * runs on pipeline rank c % p (Megatron-LM's interleaved assignment).
 * Chunk 0 also runs the prologue (embeddings), chunk K-1 the epilogue (head
 * and loss). A chunk receives its input activation from chunk c-1 (RECV)
 * and sends its output to chunk c+1 (SEND); autodiff turns those into the
 * gradient transfers. Stages are balanced by layers; the cost model prices
 * the extra prologue / epilogue work of the end stages. */
#ifndef HPDL_PIPELINE_H
#define HPDL_PIPELINE_H

#include "diag.h"
#include "ir.h"

typedef struct {
  IrModule *m;       /* graphs 0..nchunks-1 are the chunks, then the blocks */
  int nchunks;
  int64_t layers_per_chunk;
} PipeResult;

/* NULL with an error in diag when the model has no single top-level repeat
 * or its layers do not divide into `chunks`. chunks == 1 returns the module
 * unchanged (wrapped). */
PipeResult *pipe_split(Arena *arena, Diag *diag, const IrModule *m, int64_t chunks);

/* A module whose graph 0 is chunk c (the block graphs follow), ready for
 * autodiff: chunks before the last report a zero loss, since their output
 * feeds only a SEND, whose gradient arrives by RECV. */
IrModule *pipe_chunk_module(Arena *arena, const PipeResult *pr, int c);

#endif
