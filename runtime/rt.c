/* rt.c - errors, the allocation hook, the clock, file helpers. */
#define _DEFAULT_SOURCE /* madvise (Linux, the BSDs) */
#include "rt.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Formatted through a buffer of its own: a caller may pass the message
 * already in e as an argument, to put words before it ("the validation
 * data: %s", e->msg), which vsnprintf into e->msg itself would overwrite as
 * it read it. */
int rt_fail(RtErr *e, const char *fmt, ...) {
  if (e) {
    char buf[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(e->msg, buf, sizeof buf);
  }
  return -1;
}

int rt_fail_errno(RtErr *e, int errnum, const char *fmt, ...) {
  if (e) {
    char buf[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof buf) snprintf(buf + n, sizeof buf - (size_t)n, ": %s", strerror(errnum));
    memcpy(e->msg, buf, sizeof buf);
  }
  return -1;
}

int rt_err_prefix(RtErr *e, const char *fmt, ...) {
  if (!e) return -1;
  char buf[RT_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 2, fmt, ap);
  va_end(ap);
  if (n < 0) return -1;
  size_t pl = (size_t)n < sizeof buf - 3 ? (size_t)n : sizeof buf - 3;
  memcpy(buf + pl, ": ", 2);
  size_t rest = sizeof buf - pl - 3, ol = strlen(e->msg);
  if (ol > rest) ol = rest;
  memcpy(buf + pl + 2, e->msg, ol);
  buf[pl + 2 + ol] = 0;
  memcpy(e->msg, buf, sizeof buf);
  return -1;
}

/* ---- allocation ---- */

static RtAllocHook alloc_hook;

void rt_set_alloc_hook(RtAllocHook hook) { alloc_hook = hook; }

void *rt_alloc(size_t size) {
  if (size == 0) size = 1; /* a zero-size request still gets a unique pointer */
  return alloc_hook ? alloc_hook(NULL, size) : malloc(size);
}

void *rt_calloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  size_t bytes = n * size;
  void *p = rt_alloc(bytes);
  if (p) memset(p, 0, bytes > 0 ? bytes : 1);
  return p;
}

void *rt_realloc(void *p, size_t size) {
  if (size == 0) size = 1;
  return alloc_hook ? alloc_hook(p, size) : realloc(p, size);
}

void rt_free(void *p) {
  if (!p) return;
  if (alloc_hook) alloc_hook(p, 0);
  else free(p);
}

char *rt_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = rt_alloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* Aligned blocks keep the offset to the start of the underlying allocation
 * just before the aligned pointer, so they too go through the hook.
 * Blocks of at least this many bytes are mapped from the system rather
 * than taken from malloc and zeroed: the kernel's pages are zero already,
 * so nothing is written until the block is used (the pools and the arena of
 * GPT-2 small are 2.5 GB: zeroing them on one thread was a second of
 * hpdlrun's start-up; the runtime faults their pages in on all its threads,
 * par_prefault). Not asked for as transparent huge pages: with the kernel's
 * usual defrag = madvise a fault may stop to compact memory (2.5 GB took
 * 0.1 to 5.5 s here). With an allocation hook installed (tests) every block
 * goes through the hook. */
#define RT_MAP_MIN ((size_t)4 << 20)
#define RT_MAP_HEAD ((size_t)64)

void *rt_alloc_aligned(size_t size) {
  enum { ALIGN = 64 };
  if (size > SIZE_MAX - (RT_MAP_HEAD + ALIGN + sizeof(size_t))) return NULL;
  if (!alloc_hook && size >= RT_MAP_MIN) {
    size_t len = size + RT_MAP_HEAD;
    unsigned char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base != MAP_FAILED) {
      /* header: the mapped length, then 0 where a malloc'ed block keeps its offset */
      size_t zero = 0;
      memcpy(base + RT_MAP_HEAD - 2 * sizeof(size_t), &len, sizeof len);
      memcpy(base + RT_MAP_HEAD - sizeof(size_t), &zero, sizeof zero);
      return base + RT_MAP_HEAD;
    }
  }
  unsigned char *raw = rt_calloc(1, size + ALIGN + sizeof(size_t));
  if (!raw) return NULL;
  uintptr_t start = (uintptr_t)(raw + sizeof(size_t));
  uintptr_t aligned = (start + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1);
  size_t off = (size_t)(aligned - (uintptr_t)raw);
  memcpy((unsigned char *)aligned - sizeof(size_t), &off, sizeof off);
  return (void *)aligned;
}

void rt_free_aligned(void *p) {
  if (!p) return;
  size_t off;
  memcpy(&off, (unsigned char *)p - sizeof(size_t), sizeof off);
  if (off == 0) { /* mapped */
    size_t len;
    memcpy(&len, (unsigned char *)p - 2 * sizeof(size_t), sizeof len);
    munmap((unsigned char *)p - RT_MAP_HEAD, len);
    return;
  }
  rt_free((unsigned char *)p - off);
}

void rt_release_pages(void *p, size_t size) {
  long page = sysconf(_SC_PAGESIZE);
  if (!p || page <= 0) return;
  uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1), hi = ((uintptr_t)p + size) & ~(uintptr_t)(page - 1);
  /* Advice only: where it fails the pages simply stay. */
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

double rt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- files ---- */

char *rt_read_file(const char *path, size_t *len, RtErr *e) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    rt_fail_errno(e, errno, "%s: cannot open", path);
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = rt_alloc(cap);
  while (buf) {
    if (n + 1 >= cap) {
      char *nb = rt_realloc(buf, cap * 2);
      if (!nb) {
        rt_free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf) {
    rt_fail(e, "%s: out of memory reading the file", path);
    return NULL;
  }
  if (bad) {
    rt_free(buf);
    rt_fail(e, "%s: read error", path);
    return NULL;
  }
  buf[n] = 0;
  if (len) *len = n;
  return buf;
}

int rt_write_all(int fd, const void *buf, size_t len, const char *what, RtErr *e) {
  const unsigned char *p = buf;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return rt_fail_errno(e, errno, "%s: write failed", what);
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

int rt_path_join(char *out, size_t n, const char *dir, const char *name) {
  int w = (dir && *dir) ? snprintf(out, n, "%s/%s", dir, name) : snprintf(out, n, "%s", name);
  return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

int rt_fsync_dir_of(const char *path, RtErr *e) {
  char dir[4096];
  size_t n = strlen(path);
  if (n >= sizeof dir) return rt_fail(e, "%s: path too long", path);
  memcpy(dir, path, n + 1);
  char *slash = strrchr(dir, '/');
  if (!slash) strcpy(dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return rt_fail_errno(e, errno, "%s: cannot open the folder to sync it", dir);
  /* Some file systems refuse fsync on a folder (EINVAL): the rename is still
   * atomic there, only its durability is the file system's business. */
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc < 0 && err != EINVAL && err != EROFS) return rt_fail_errno(e, err, "%s: fsync of the folder failed", dir);
  return 0;
}

int rt_mkdirs(const char *path, RtErr *e) {
  char buf[4096];
  size_t n = strlen(path);
  if (n == 0) return 0;
  if (n >= sizeof buf) return rt_fail(e, "%s: path too long", path);
  memcpy(buf, path, n + 1);
  for (char *p = buf + 1; ; p++) {
    if (*p == '/' || *p == 0) {
      char c = *p;
      *p = 0;
      if (mkdir(buf, 0777) < 0 && errno != EEXIST) return rt_fail_errno(e, errno, "%s: cannot create the folder", buf);
      struct stat st;
      if (stat(buf, &st) < 0 || !S_ISDIR(st.st_mode)) return rt_fail(e, "%s: exists and is not a folder", buf);
      *p = c;
      if (!c) break;
    }
  }
  return 0;
}

int rt_write_file_atomic(const char *path, const void *buf, size_t len, RtErr *e) {
  char tmp[4200];
  const char *slash = strrchr(path, '/');
  int dirlen = slash ? (int)(slash - path) : 0;
  const char *base = slash ? slash + 1 : path;
  /* A hidden name in the same folder (rename is atomic only within one file
   * system), with our pid so that two writers never share a temporary. */
  int w = slash ? snprintf(tmp, sizeof tmp, "%.*s/.%s.tmp.%ld", dirlen, path, base, (long)getpid())
                : snprintf(tmp, sizeof tmp, ".%s.tmp.%ld", base, (long)getpid());
  if (w < 0 || (size_t)w >= sizeof tmp) return rt_fail(e, "%s: path too long", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return rt_fail_errno(e, errno, "%s: cannot create", tmp);
  int rc = rt_write_all(fd, buf, len, tmp, e);
  if (rc == 0 && fsync(fd) < 0) rc = rt_fail_errno(e, errno, "%s: fsync failed", tmp);
  if (rc < 0) {
    close(fd);
    unlink(tmp);
    return -1;
  }
  if (close(fd) < 0) {
    int err = errno;
    unlink(tmp);
    return rt_fail_errno(e, err, "%s: close failed", tmp);
  }
  if (rename(tmp, path) < 0) {
    int err = errno;
    unlink(tmp);
    return rt_fail_errno(e, err, "%s: cannot rename into place", path);
  }
  return rt_fsync_dir_of(path, e);
}

int64_t rt_fault(const char *name) {
  const char *spec = getenv("HPDL_FAULT");
  if (!spec || !*spec) return -1;
  size_t n = strlen(name);
  for (const char *p = spec; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len > n && !strncmp(p, name, n) && p[n] == '=') return strtoll(p + n + 1, NULL, 10);
    if (len == n && !strncmp(p, name, n)) return 0;
    p += len;
    if (*p == ',') p++;
  }
  return -1;
}

/* ---- stop requests by signal ---- */

static volatile sig_atomic_t g_signal; /* the first stop signal, 0 before it */
static struct sigaction g_old[4];
static const int g_caught[4] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2};
static int g_installed;

static void on_signal(int sig) {
  if (g_signal && (sig == SIGTERM || sig == SIGINT)) _exit(128 + sig); /* asked twice: at once */
  if (!g_signal) g_signal = sig;
}

void rt_stop_catch(void) {
  if (g_installed) return;
  g_signal = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; /* the step's reads, writes and MPI calls go on */
  for (int i = 0; i < 4; i++) sigaction(g_caught[i], &sa, &g_old[i]);
  g_installed = 1;
}

void rt_stop_release(void) {
  if (!g_installed) return;
  for (int i = 0; i < 4; i++) sigaction(g_caught[i], &g_old[i], NULL);
  g_installed = 0;
}

RtStopKind rt_stop_requested(int *from_launcher) {
  int sig = g_signal;
  if (from_launcher) *from_launcher = sig == SIGUSR1 || sig == SIGUSR2;
  if (sig == SIGTERM || sig == SIGUSR1) return RT_STOP_TERM;
  if (sig == SIGINT || sig == SIGUSR2) return RT_STOP_INT;
  return RT_STOP_NONE;
}

int rt_stop_exit_status(RtStopKind k) {
  return k == RT_STOP_TERM ? 128 + SIGTERM : k == RT_STOP_INT ? 128 + SIGINT : 0;
}

const char *rt_stop_signal_name(RtStopKind k) {
  return k == RT_STOP_TERM ? "SIGTERM" : k == RT_STOP_INT ? "SIGINT" : "no signal";
}

void rt_note_reported(void) {
  const char *note = getenv("HPDL_REPORTED");
  if (!note || !*note) return;
  int fd = open(note, O_WRONLY | O_CREAT, 0600);
  if (fd >= 0) close(fd);
}
