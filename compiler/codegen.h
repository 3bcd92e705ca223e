/* codegen.h - the back-end interface, and the ABI of what back ends emit.
 *
 * Back ends sit behind one struct of function pointers (QBE's `struct
 * Target`): the driver hands a back end the fused module (fuse.h) and, when
 * the memory planner has run, its plan; the back end turns every graph into
 * an entry point and writes an artifact. The CPU back end (codegen_cpu.c,
 * LLVM) writes a shared library; the CUDA back end will write its kernels
 * and host code behind the same calls.
 *
 * The first part of this header is the ABI of the artifact: plain C, no
 * compiler types, so the runtime can include it with HPD_ABI_ONLY defined
 * (it needs nothing else from the compiler). docs/backend.md explains it
 * with an example. */
#ifndef HPDL_CODEGEN_H
#define HPDL_CODEGEN_H

#include <stddef.h>
#include <stdint.h>

/* ==== the artifact ABI ==== */

#define HPD_ABI_VERSION 2 /* 2: the extern hook */

/* Per call of an entry point: what the generated code needs besides
 * tensors. The layout is fixed (the generated code reads it by offset). */
typedef struct hpd_ctx {
  void *workspace; /* the graph's hpd_graph_desc.workspace_bytes, 64-byte aligned */
  uint64_t seed;   /* the run's init seed: dropout masks (interp.c's streams) */
  int64_t layer;   /* the layer a repeated block's graph runs as, when called directly */
  int32_t rank[4]; /* this rank's index in each group (IrGroup order: dp, tp, pp, cp) */
  int32_t size[4]; /* the size of each group; 0 or 1: this rank alone */
  void *comm;      /* the runtime's communicator, passed back to the callbacks below */
  /* Collectives on fp32 data; 0 on success. op: 0 sum, 1 max. all_gather
   * writes size x n values, rank by rank. send / recv: to / from the rank
   * `offset` places along the group (+1 next pipeline stage, -1 previous). */
  int (*all_reduce)(void *comm, int group, int op, float *data, int64_t n);
  int (*all_gather)(void *comm, int group, const float *in, int64_t n, float *out);
  int (*send)(void *comm, int group, int offset, const float *data, int64_t n);
  int (*recv)(void *comm, int group, int offset, float *data, int64_t n);
  const char *error; /* set by the generated code when an entry point returns non-zero */
  /* Calls of `extern` native functions (IrModule.externs; docs/backend.md):
   * `externs` is the runtime's table of loaded functions, passed back to the
   * hook. grad 0: the forward, bufs = the arguments, then the result; grad 1:
   * the gradient function, bufs = the arguments, the result's gradient, then
   * the arguments' gradients concatenated (EXTERN_GRAD's layout; the hook
   * zeroes it). 0 on success, else non-zero with ctx->error set. */
  void *externs;
  int (*call_extern)(struct hpd_ctx *ctx, int32_t index, int32_t grad, void **bufs);
} hpd_ctx;

/* Every entry point takes one table of buffers:
 *   buffers[0]                                  hpd_ctx *
 *   buffers[HPD_BUF_INPUTS + i]                 model input i (IrModule.inputs), row-major,
 *                                               of its dtype (f32 float, i32 / i64 ints)
 *   buffers[HPD_BUF_INPUTS + ninputs + p]       parameter p, all `count` copies (layer-major)
 *   buffers[HPD_BUF_INPUTS + ninputs + np + p]  gradient of parameter p, same shape: a graph
 *                                               that autodiff made ADDS its gradient outputs
 *                                               here (copy `layer`), as interp's store does;
 *                                               NULL for parameters it does not touch
 *   then the graph's nargs arguments, then its noutputs outputs (the gradient
 *   outputs excluded), caller-allocated, each row-major of its node's shape.
 * An entry point returns 0, or non-zero with ctx->error set. */
enum { HPD_BUF_CTX = 0, HPD_BUF_INPUTS = 1 };

typedef int (*hpd_entry_fn)(void **buffers);

typedef struct {
  const char *name;        /* the IR graph's name: "forward", "blocks.grad" */
  hpd_entry_fn fn;         /* hpd_graph_<name, '.' as '_'> */
  int32_t nargs;           /* argument slots */
  int32_t noutputs;        /* output slots (gradients excluded) */
  int32_t ngrads;          /* gradient outputs accumulated into the grad slots */
  int32_t nbuffers;        /* the table's length */
  int64_t workspace_bytes; /* what ctx->workspace must hold for this graph (its calls included) */
} hpd_graph_desc;

typedef struct {
  int32_t abi_version; /* HPD_ABI_VERSION */
  int32_t ngraphs, ninputs, nparams;
  const hpd_graph_desc *graphs; /* in IrModule order */
  const char *target;           /* "x86_64-pc-linux-gnu icelake-client" */
} hpd_module_desc;

/* The one data symbol every artifact library exports. */
#define HPD_MODULE_SYMBOL "hpd_module"

#ifndef HPD_ABI_ONLY

/* ==== the compiler side ==== */

#include <stdio.h>

#include "fuse.h"
#include "ir.h"
#include "memplan.h"

typedef struct {
  int opt_level;          /* 0-3; default (0 in the struct means "default") is 3 */
  int no_opt;             /* run no passes at all (tests of the unoptimised IR) */
  int acc_f64;            /* accumulate row reductions in fp64 (default fp32; docs/backend.md) */
  int export_kernels;     /* also export hpd_kernel_<graph>_<k>(void **io) per kernel (tests) */
  int unroll;             /* let LLVM unroll loops (off: twice the compile time, no faster kernels measured) */
  const char *cpu;        /* NULL: the host's (LLVMGetHostCPUName) */
  const char *features;   /* NULL: the host's */
  const char *cc;         /* the C compiler that links the library; NULL: $HPDL_CC, else "cc" */
  const char *link_flags; /* appended to the link; NULL: "-lopenblas -lm" */
  /* The static memory plan (memplan.h) made with this fusion: every value,
   * stash and call workspace at the plan's offsets, loop kernels in place
   * where it says. NULL: the back end's own first-fit plan. */
  const MemPlan *memplan;
} CgOptions;

/* Seconds spent in each phase of the last emit. */
typedef struct {
  double generate, verify, optimize, codegen, link;
  int functions; /* functions in the module (kernels, graphs, helpers) */
  int kernels;
} CgStats;

typedef struct CgTarget CgTarget; /* a back end's state for one module */

typedef struct {
  const char *name; /* "cpu", "cuda" */
  /* A target for `m` as fused in `fr` (both must outlive it). NULL with the
   * reason in err when the back end cannot start (no such CPU, ...). */
  CgTarget *(*create)(const IrModule *m, const FuseResult *fr, const CgOptions *opt, char *err, size_t errlen);
  /* Generates code for every graph and kernel and optimises it. 0 or -1. */
  int (*generate)(CgTarget *t);
  /* Writes the artifact: the CPU back end a shared library at `path`. 0 or -1. */
  int (*emit)(CgTarget *t, const char *path);
  /* The generated code in readable form (LLVM IR text; CUDA C++), for tests
   * and `hpdlc emit`; the caller frees it with free(). */
  char *(*dump)(CgTarget *t);
  const char *(*error)(const CgTarget *t); /* why the last call failed */
  const CgStats *(*stats)(const CgTarget *t);
  void (*destroy)(CgTarget *t);
} CgBackend;

/* The back ends built into this compiler; NULL for one that is not
 * (the CPU back end needs LLVM at build time). */
const CgBackend *cg_backend(const char *name);

/* The C symbol of graph `name`'s entry point: "hpd_graph_" + name with
 * every character outside [A-Za-z0-9_] as '_'. Returns the length written. */
size_t cg_graph_symbol(const char *name, char *buf, size_t n);

#endif /* HPD_ABI_ONLY */

#endif
