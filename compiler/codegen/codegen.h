/* codegen.h - the back-end interface, and the ABI of what back ends emit.
 *
 * Back ends sit behind one struct of function pointers (QBE's `struct
 * Target`): the driver hands a back end the fused module (fuse.h) and, when
 * the memory planner has run, its plan; the back end turns every graph into
 * an entry point and writes an artifact. The CPU back end (codegen_cpu.c,
 * LLVM) writes a shared library; the CUDA back end will write its kernels
 * and host code behind the same calls.
 *
 * What the emitted code and the runtime agree on (the artifact's ABI) is
 * core/hpd_abi.h, which the runtime includes without the compiler. */
#ifndef HPDL_CODEGEN_H
#define HPDL_CODEGEN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fuse.h"
#include "hpd_abi.h"
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
  /* The CUDA back end: the GPU architecture ("sm_80"; NULL: sm_80), where
   * kernels/hpdl_cuda.cuh is (NULL: $HPDL_KERNELS_DIR, else the source
   * tree's), and whether to use the NVRTC cache. */
  const char *arch;
  const char *kernels_dir;
  int no_cache;
  /* Also write, after the kernels and hidden from NVRTC, one host entry per
   * fused kernel for the emulation harness (kernels/cuda_emu.h):
   * extern "C" int hpd_emu_<graph>_k<k>(const hpdl_kctx *, void **io). */
  int emulate;
  /* The optimizer's kernels for bf16 moments too (train.moments = bf16:
   * kernels/hpdl_optim.cuh's hpdl_adamw_bf16m, hpdl_sgd_bf16m), compiled only
   * into the modules of a run that uses them. */
  int moments16;
  /* The path of source file `file` (Span.file), for the comments that say
   * where a kernel's ops come from; NULL: "line N" only. */
  const char *(*source_path)(void *ctx, int file);
  void *source_ctx;
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

#endif
