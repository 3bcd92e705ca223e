/* cudacc.h - CUDA C++ to cubin + PTX through NVRTC, with a content-addressed
 * cache. The CUDA back end hands it the source it generated and gets back
 * what goes into the artifact.
 *
 * NVRTC is loaded at run time with dlopen, so that neither the build nor an
 * hpdlc without a GPU back end needs CUDA. Search order (the first that
 * opens and has every function wins, and serves the whole process):
 *   $HPDL_NVRTC (a full path), $CUDA_HOME/lib64/libnvrtc.so,
 *   /usr/local/cuda/lib64/libnvrtc.so, then the sonames libnvrtc.so.13,
 *   libnvrtc.so.12, libnvrtc.so on the loader's search path.
 *
 * One compile for `sm_XX` gives both images: NVRTC 13 returns the cubin for
 * sm_XX and the PTX it assembled it from (`.target sm_XX`, byte for byte the
 * PTX a compile for compute_XX gives), which the driver JIT-compiles on a
 * newer GPU. Arch-specific targets (sm_90a, sm_100a, sm_100f) give PTX that
 * runs on that family only. ptxas runs with -v; its report is parsed into
 * per-kernel resource usage.
 *
 * The cache. Directory: $HPDL_CACHE if set, else $XDG_CACHE_HOME/hpdl/nvrtc,
 * else $HOME/.cache/hpdl/nvrtc. An entry is DIR/<k0k1>/<key>.hnvc where key
 * is the hex SHA-256 of: a format tag, the arch, the exact option list (an
 * include directory by position, not name: what it holds counts, below), the
 * source, the contents of every header the source reaches through #include
 * lines (resolved as NVRTC does: quoted ones next to the including file -
 * the working directory for the source itself - then the include
 * directories in order; an include found nowhere is one of NVRTC's built-in
 * headers and is hashed by name; #if is ignored, so more headers may count
 * than are used, never fewer; an #include of a macro is not followed; by
 * content and order, not path, so the same headers in another folder - each
 * artifact's copy of kernels/ - key alike: only a header's __FILE__ could
 * tell them apart, and none of ours uses it), and the identity of the NVRTC library: its canonical path, size and mtime.
 * The identity (not nvrtcVersion) is what lets a cache hit skip loading
 * NVRTC: when NVRTC is found by path it is stat()ed, not opened; only a
 * library found by soname is opened (not called) to learn its path. An
 * entry is always stored under the identity of the library that compiled
 * it, so a hit never returns another NVRTC's output. The entry: a header
 * (magic "HPDLNVC1", format version, the key, the NVRTC version and the
 * lengths of cubin, PTX and compile log), the three blobs, and the SHA-256
 * of everything before it. One whose magic, key, lengths or checksum do not
 * hold is ignored (and recompiled over). Entries are written to a unique
 * temporary file in the same directory, fsync()ed and renamed into place,
 * so concurrent compiles of one key are safe (the last rename wins, both
 * are whole). A cache that cannot be read or written costs only the
 * compile: the first such problem is reported in CudaccResult.warning.
 *
 * Not thread-safe within one result; compiles may run in parallel threads
 * (NVRTC is loaded once, under a lock). */
#ifndef HPDL_CUDACC_H
#define HPDL_CUDACC_H

#include <stddef.h>

typedef struct {
  const char *source;                /* CUDA C++ text, NUL-terminated */
  const char *name;                  /* program name in the log ("name(LINE): error"); NULL: "hpdl.cu" */
  const char *arch;                  /* "sm_80", "sm_90", "sm_90a", "sm_100" ... */
  const char *const *options;        /* extra NVRTC options, passed after cudacc's own */
  size_t n_options;
  const char *const *include_dirs;   /* --include-path, in this order (kernels/, $CUDA_HOME/include) */
  size_t n_include_dirs;
  int use_cache;                     /* look up and store in the cache */
} CudaccRequest;

/* One kernel's resources as ptxas reported them. */
typedef struct {
  char *name;       /* as in the cubin (mangled unless extern "C") */
  int registers;    /* per thread */
  int barriers;
  long smem_bytes;  /* static shared memory */
  long spill_store; /* bytes */
  long spill_load;  /* bytes */
  long stack;       /* stack frame bytes per thread */
} CudaccKernelInfo;

typedef struct {
  unsigned char *cubin; /* ELF for the request's sm_XX */
  size_t cubin_size;
  char *ptx;            /* NUL-terminated; ptx_size excludes the NUL */
  size_t ptx_size;
  int nvrtc_major, nvrtc_minor;
  char **options;       /* exactly what nvrtcCompileProgram was given, in order */
  size_t n_options;
  char *log;            /* NVRTC's full log (errors, warnings, ptxas -v); never NULL */
  char hash[65];        /* the cache key, hex SHA-256 */
  CudaccKernelInfo *kernels; /* one per entry function, in ptxas order */
  size_t n_kernels;
  int sm;               /* the SM number of the arch (90 for sm_90a) */
  int cache_hit;        /* 1: read from the cache, NVRTC not called */
  char *warning;        /* the first cache problem, NULL if none */
  double seconds;       /* wall time of the cudacc_compile call */
} CudaccResult;

/* Compiles req->source for req->arch. 0, or -1 with a one-line reason in
 * err: a compile error leaves NVRTC's whole log in out->log (the caller maps
 * its "name(LINE): error" lines back to what it generated). out is always
 * filled enough for cudacc_result_free. */
int cudacc_compile(const CudaccRequest *req, CudaccResult *out, char *err, size_t errlen);
void cudacc_result_free(CudaccResult *r);

/* Checks that cubin is a whole 64-bit little-endian ELF with e_machine
 * EM_CUDA (190) and stores its SM number in *sm_out (may be NULL). 0 or -1
 * with the reason in err. */
int cudacc_elf_check(const void *cubin, size_t n, int *sm_out, char *err, size_t errlen);

/* SHA-256 of n bytes as 64 hex digits and a NUL (the cache key's hash;
 * exposed for its test vectors). */
void cudacc_sha256_hex(const void *data, size_t n, char out[65]);

/* The cache directory the environment names now, in buf; 0, or -1 when
 * none can be named (no $HPDL_CACHE, $XDG_CACHE_HOME or $HOME). */
int cudacc_cache_dir(char *buf, size_t n);

/* The cache's size limit in bytes: $HPDL_CACHE_SIZE (a number with an
 * optional K, M or G; 0: no limit), else CUDACC_CACHE_SIZE_DEFAULT; -1 when
 * the variable is malformed (the caller then keeps the default). */
enum { CUDACC_CACHE_SIZE_DEFAULT_MB = 2048 };
long long cudacc_cache_limit(void);
/* Marks a cache entry used now (its modification time): the trim below
 * removes the least recently used first. */
void cudacc_cache_touch(const char *path);
/* After a store: when the files under dir (NVRTC's entries and the
 * emulation's, emu/) exceed the limit, removes the least recently used
 * until they fill at most 80% of it, never keep (the entry just written).
 * Errors are ignored: the cache is an optimisation. Returns the files
 * removed. */
int cudacc_cache_trim(const char *dir, const char *keep);

/* The search for NVRTC, exposed so that a test can give its own list. */
typedef struct {
  const char *label; /* how the message names it: "$HPDL_NVRTC", "libnvrtc.so.13" */
  const char *path;  /* what dlopen gets (contains '/': a file); NULL: its variable is unset */
} CudaccCandidate;

enum { CUDACC_MAX_CANDIDATES = 8 };

/* The search list as the environment says now. Paths are built in buf.
 * Returns how many it wrote (at most cap; CUDACC_MAX_CANDIDATES is enough). */
size_t cudacc_nvrtc_candidates(CudaccCandidate *list, size_t cap, char *buf, size_t buflen);

typedef struct CudaccNvrtc CudaccNvrtc;

/* Opens the first candidate that dlopens and has every function cudacc
 * calls. NULL with one line in err naming every place tried and why each
 * failed ("NVRTC not found: tried $HPDL_NVRTC=/x (no such file), ...").
 * The process's own NVRTC is opened by cudacc_compile; this is for tests
 * and tools. */
CudaccNvrtc *cudacc_nvrtc_open(const CudaccCandidate *list, size_t n, char *err, size_t errlen);
const char *cudacc_nvrtc_path(const CudaccNvrtc *lib); /* the file that was opened */
int cudacc_nvrtc_version(const CudaccNvrtc *lib, int *major, int *minor); /* 0 or -1 */
void cudacc_nvrtc_close(CudaccNvrtc *lib);

/* The process's NVRTC (opened on first use from cudacc_nvrtc_candidates);
 * NULL with the not-found line in err. */
const CudaccNvrtc *cudacc_nvrtc(char *err, size_t errlen);

#endif
