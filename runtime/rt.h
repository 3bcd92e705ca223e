/* rt.h - what every runtime module shares: error reports, the allocation
 * hook, a clock, and small file helpers.
 *
 * Errors: a function that can fail returns 0 on success and -1 on failure,
 * with a complete message (naming the file, byte offset, tensor... that is
 * at fault) in an RtErr the caller passes. Nothing in the library prints or
 * exits; hpdlrun decides what to do with a message.
 *
 * Memory: every allocation goes through rt_alloc / rt_calloc / rt_realloc /
 * rt_free, so a test can install a hook that fails the n-th allocation and
 * check that each path reports "out of memory" instead of crashing. */
#ifndef HPDL_RT_H
#define HPDL_RT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
/* Token shards and safetensors are little-endian; we copy them as they lie. */
#error "the hpdl runtime assumes a little-endian host"
#endif

enum { RT_ERR_LEN = 1024 };

typedef struct {
  char msg[RT_ERR_LEN];
} RtErr;

/* Formats a message into e (when not NULL); returns -1 so that callers can
 * write `return rt_fail(e, ...)`. */
int rt_fail(RtErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As rt_fail, with ": strerror(errnum)" appended. */
int rt_fail_errno(RtErr *e, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Puts `prefix: ` before the message already in e (context for a caller). */
int rt_err_prefix(RtErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The allocation hook: NULL restores malloc. The hook gets (old, size):
 * old NULL is an allocation, size 0 a free. */
typedef void *(*RtAllocHook)(void *old, size_t size);
void rt_set_alloc_hook(RtAllocHook hook);
void *rt_alloc(size_t size);               /* NULL when out of memory */
void *rt_calloc(size_t n, size_t size);    /* zeroed; NULL on overflow or out of memory */
void *rt_realloc(void *p, size_t size);
void rt_free(void *p);
char *rt_strdup(const char *s);            /* NULL when out of memory */
/* 64-byte aligned (cache lines, SIMD), zeroed; free with rt_free_aligned. */
void *rt_alloc_aligned(size_t size);
void rt_free_aligned(void *p);
/* Gives the whole pages inside [p, p + size) back to the system (madvise
 * MADV_DONTNEED) while the block stays allocated: for a buffer that is idle
 * between uses. Those pages read as zeros afterwards. */
void rt_release_pages(void *p, size_t size);

/* Seconds on a monotonic clock. */
double rt_now(void);

/* Reads a whole file (NUL-terminated; *len without the NUL). */
char *rt_read_file(const char *path, size_t *len, RtErr *e);
/* Writes buf to path atomically: a temporary file in the same folder,
 * fsync, rename over path, fsync of the folder. After a crash the path
 * holds either the old contents or the new, never a mix. */
int rt_write_file_atomic(const char *path, const void *buf, size_t len, RtErr *e);
/* Writes all of buf (retrying short writes and EINTR). */
int rt_write_all(int fd, const void *buf, size_t len, const char *what, RtErr *e);
/* fsync of the folder that holds path, so that a rename in it is durable. */
int rt_fsync_dir_of(const char *path, RtErr *e);
/* mkdir -p */
int rt_mkdirs(const char *path, RtErr *e);
/* dir + "/" + name into out (size n); -1 when it does not fit. */
int rt_path_join(char *out, size_t n, const char *dir, const char *name);

/* Test-only fault injection, read once from the environment variable
 * HPDL_FAULT ("name=value,name=value"); returns the value of `name` or -1.
 * Used to prove that a writer killed half-way never leaves a checkpoint that
 * looks valid (see docs/runtime.md, "Fault injection"). */
int64_t rt_fault(const char *name);

/* A stop request by signal: finish the step, checkpoint, exit.
 *
 * SLURM and Kubernetes end a job with SIGTERM and a grace period (SLURM's
 * KillWait, Kubernetes' terminationGracePeriodSeconds) before SIGKILL; a
 * person at a terminal presses Ctrl-C (SIGINT). A rank that gets either
 * finishes the step it is in; the ranks agree on the request in the step's
 * one reduction (train.c), write a checkpoint and return, and the process
 * exits with 128 + the signal (143, 130). A second SIGTERM or SIGINT ends the
 * process at once.
 *
 * Under hpdlrun's own launcher the signal reaches hpdlrun, not the ranks:
 * mpirun would answer SIGTERM by killing the job after a few seconds, so
 * hpdlrun sends mpirun SIGUSR1 (for SIGTERM) or SIGUSR2 (for SIGINT), which
 * mpirun passes to every rank; a rank stopped so exits 0 and hpdlrun exits
 * 143 / 130 itself (docs/runtime.md, "Stopping a run"). */
typedef enum {
  RT_STOP_NONE,
  RT_STOP_TERM, /* SIGTERM, or the launcher's SIGUSR1 */
  RT_STOP_INT   /* SIGINT, or the launcher's SIGUSR2 */
} RtStopKind;

/* Catches SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 until rt_stop_release. */
void rt_stop_catch(void);
void rt_stop_release(void);

/* The request so far, and whether it came through the launcher (SIGUSR1/2). */
RtStopKind rt_stop_requested(int *from_launcher);

/* The exit status of a process stopped by `k`: 128 + SIGTERM or SIGINT. */
int rt_stop_exit_status(RtStopKind k);

/* "SIGTERM" / "SIGINT" */
const char *rt_stop_signal_name(RtStopKind k);

/* Notes that this rank printed the job's error, in the file hpdlrun's
 * launcher names in HPDL_REPORTED (nothing without it), so that the
 * launcher does not add that no rank said why the job failed. */
void rt_note_reported(void);

#endif
