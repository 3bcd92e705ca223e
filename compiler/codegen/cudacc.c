/* cudacc.c - NVRTC through dlopen, the compile cache, cubin checks (cudacc.h). */
#define _GNU_SOURCE /* dladdr: the file a soname resolved to */
#include "cudacc.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------ */

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* ---- SHA-256 (FIPS 180-4) ----------------------------------------------- */

typedef struct {
  uint32_t h[8];
  uint64_t len; /* bytes fed */
  unsigned char buf[64];
  size_t fill;
} Sha256;

static const uint32_t sha_k[64] = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(uint32_t h[8], const unsigned char *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = k + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
    uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

static void sha_init(Sha256 *s) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof h0);
  s->len = 0;
  s->fill = 0;
}

static void sha_update(Sha256 *s, const void *data, size_t n) {
  const unsigned char *p = data;
  s->len += n;
  if (s->fill) {
    size_t take = 64 - s->fill < n ? 64 - s->fill : n;
    memcpy(s->buf + s->fill, p, take);
    s->fill += take, p += take, n -= take;
    if (s->fill < 64) return;
    sha_block(s->h, s->buf);
    s->fill = 0;
  }
  for (; n >= 64; p += 64, n -= 64) sha_block(s->h, p);
  memcpy(s->buf, p, n);
  s->fill = n;
}

static void sha_final(Sha256 *s, unsigned char out[32]) {
  uint64_t bits = s->len * 8;
  unsigned char pad[72] = {0x80};
  size_t padn = (s->fill < 56 ? 56 : 120) - s->fill;
  for (int i = 0; i < 8; i++) pad[padn + i] = (unsigned char)(bits >> (56 - 8 * i));
  sha_update(s, pad, padn + 8);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) out[4 * i + j] = (unsigned char)(s->h[i] >> (24 - 8 * j));
}

/* A string with its NUL, so that ("ab","c") and ("a","bc") hash apart. */
static void sha_str(Sha256 *s, const char *str) { sha_update(s, str, strlen(str) + 1); }

static void hexify(const unsigned char *d, size_t n, char *out) {
  static const char hx[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) out[2 * i] = hx[d[i] >> 4], out[2 * i + 1] = hx[d[i] & 15];
  out[2 * n] = 0;
}

void cudacc_sha256_hex(const void *data, size_t n, char out[65]) {
  Sha256 s;
  unsigned char d[32];
  sha_init(&s);
  sha_update(&s, data, n);
  sha_final(&s, d);
  hexify(d, 32, out);
}

/* ---- NVRTC through dlopen ----------------------------------------------- */

/* nvrtc.h's types as the ABI has them: nvrtcResult is an int-sized enum,
 * nvrtcProgram a pointer. Declared here so the build needs no CUDA. */
typedef int NvrtcResult;
typedef struct NvrtcProgramImpl *NvrtcProgram;

struct CudaccNvrtc {
  void *dl;
  char *path;     /* the file opened (canonical) */
  char *identity; /* path, size and mtime: what the cache key names it by */
  int major, minor;
  const char *(*nvrtcGetErrorString)(NvrtcResult);
  NvrtcResult (*nvrtcVersion)(int *, int *);
  NvrtcResult (*nvrtcCreateProgram)(NvrtcProgram *, const char *, const char *, int, const char *const *,
                                    const char *const *);
  NvrtcResult (*nvrtcCompileProgram)(NvrtcProgram, int, const char *const *);
  NvrtcResult (*nvrtcDestroyProgram)(NvrtcProgram *);
  NvrtcResult (*nvrtcGetProgramLogSize)(NvrtcProgram, size_t *);
  NvrtcResult (*nvrtcGetProgramLog)(NvrtcProgram, char *);
  NvrtcResult (*nvrtcGetPTXSize)(NvrtcProgram, size_t *);
  NvrtcResult (*nvrtcGetPTX)(NvrtcProgram, char *);
  NvrtcResult (*nvrtcGetCUBINSize)(NvrtcProgram, size_t *);
  NvrtcResult (*nvrtcGetCUBIN)(NvrtcProgram, char *);
};

/* Records which NVRTC call failed, NVRTC's name for the error and where, as
 * llm.c's cudaCheck does; the caller jumps to its cleanup. */
static void nvrtc_fail(const CudaccNvrtc *L, NvrtcResult rc, const char *call, const char *file, int line,
                       char *err, size_t errlen) {
  const char *s = L->nvrtcGetErrorString ? L->nvrtcGetErrorString(rc) : NULL;
  seterr(err, errlen, "%s failed: %s (%d) at %s:%d", call, s ? s : "unknown NVRTC error", rc, base_name(file),
         line);
}

#define NVRTC_CHECK(L, call)                                                 \
  do {                                                                       \
    NvrtcResult rc_ = (L)->call;                                             \
    if (rc_ != 0) {                                                          \
      nvrtc_fail((L), rc_, #call, __FILE__, __LINE__, err, errlen);          \
      goto fail;                                                             \
    }                                                                        \
  } while (0)

/* "canonical path\nsize\nmtime": a library replaced or upgraded in place
 * changes size or mtime, so it keys apart. */
static char *file_identity(const char *path) {
  char real[PATH_MAX];
  struct stat st;
  if (!realpath(path, real) || stat(real, &st) != 0) return NULL;
  char buf[PATH_MAX + 64];
  snprintf(buf, sizeof buf, "%s\n%lld\n%lld.%09ld", real, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
           st.st_mtim.tv_nsec);
  return xstrdup(buf);
}

size_t cudacc_nvrtc_candidates(CudaccCandidate *list, size_t cap, char *buf, size_t buflen) {
  size_t n = 0;
#define ADD(L, P)                              \
  do {                                         \
    if (n < cap) list[n].label = (L), list[n].path = (P); \
    n++;                                       \
  } while (0)
  const char *env = getenv("HPDL_NVRTC");
  ADD("$HPDL_NVRTC", env && *env ? env : NULL);
  const char *home = getenv("CUDA_HOME");
  const char *p = NULL;
  if (home && *home && buf && buflen) {
    int k = snprintf(buf, buflen, "%s/lib64/libnvrtc.so", home);
    if (k > 0 && (size_t)k < buflen) p = buf;
  }
  ADD("$CUDA_HOME/lib64/libnvrtc.so", p);
  ADD("/usr/local/cuda/lib64/libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so");
  ADD("libnvrtc.so.13", "libnvrtc.so.13");
  ADD("libnvrtc.so.12", "libnvrtc.so.12");
  ADD("libnvrtc.so", "libnvrtc.so");
#undef ADD
  return n < cap ? n : cap;
}

/* Resolves every function cudacc calls; the name of the first missing one. */
static const char *nvrtc_resolve(CudaccNvrtc *L) {
#define SYM(f)                              \
  {                                         \
    void *s_ = dlsym(L->dl, #f);            \
    if (!s_) return #f;                     \
    memcpy(&L->f, &s_, sizeof s_);          \
  }
  SYM(nvrtcGetErrorString)
  SYM(nvrtcVersion)
  SYM(nvrtcCreateProgram)
  SYM(nvrtcCompileProgram)
  SYM(nvrtcDestroyProgram)
  SYM(nvrtcGetProgramLogSize)
  SYM(nvrtcGetProgramLog)
  SYM(nvrtcGetPTXSize)
  SYM(nvrtcGetPTX)
  SYM(nvrtcGetCUBINSize)
  SYM(nvrtcGetCUBIN)
#undef SYM
  return NULL;
}

void cudacc_nvrtc_close(CudaccNvrtc *L) {
  if (!L) return;
  if (L->dl) dlclose(L->dl);
  free(L->path);
  free(L->identity);
  free(L);
}

/* Appends to the not-found message, keeping what fits. */
static void msg_add(char *m, size_t mlen, size_t *at, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void msg_add(char *m, size_t mlen, size_t *at, const char *fmt, ...) {
  if (!m || *at + 1 >= mlen) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(m + *at, mlen - *at, fmt, ap);
  va_end(ap);
  if (k > 0) *at = *at + (size_t)k < mlen ? *at + (size_t)k : mlen - 1;
}

/* Opens one candidate; NULL with why it failed in why. */
static CudaccNvrtc *nvrtc_try(const CudaccCandidate *c, char *why, size_t whylen) {
  if (!c->path) {
    seterr(why, whylen, "unset");
    return NULL;
  }
  struct stat st;
  if (strchr(c->path, '/') && stat(c->path, &st) != 0) {
    seterr(why, whylen, "%s", errno == ENOENT ? "no such file" : strerror(errno));
    return NULL;
  }
  void *dl = dlopen(c->path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char *e = dlerror();
    e = e ? e : "unknown error";
    /* dlerror starts with the name we gave it; say it once. */
    size_t pl = strlen(c->path);
    if (strncmp(e, c->path, pl) == 0 && e[pl] == ':') e += pl + 1 + (e[pl + 1] == ' ');
    seterr(why, whylen, "dlopen: %s", e);
    return NULL;
  }
  CudaccNvrtc *L = calloc(1, sizeof *L);
  if (!L) {
    dlclose(dl);
    seterr(why, whylen, "out of memory");
    return NULL;
  }
  L->dl = dl;
  const char *missing = nvrtc_resolve(L);
  if (missing) {
    seterr(why, whylen, "no %s: not NVRTC 11.1 or later", missing);
    cudacc_nvrtc_close(L);
    return NULL;
  }
  /* The file the loader actually mapped (a soname resolves on its search path). */
  Dl_info di;
  void *fn;
  memcpy(&fn, &L->nvrtcVersion, sizeof fn);
  const char *file = dladdr(fn, &di) && di.dli_fname ? di.dli_fname : c->path;
  char real[PATH_MAX];
  L->path = xstrdup(realpath(file, real) ? real : file);
  L->identity = file_identity(L->path);
  char err[256];
  size_t errlen = sizeof err;
  NVRTC_CHECK(L, nvrtcVersion(&L->major, &L->minor));
  if (!L->path || !L->identity) {
    seterr(why, whylen, "cannot stat %s", file);
    cudacc_nvrtc_close(L);
    return NULL;
  }
  return L;
fail:
  seterr(why, whylen, "%s", err);
  cudacc_nvrtc_close(L);
  return NULL;
}

CudaccNvrtc *cudacc_nvrtc_open(const CudaccCandidate *list, size_t n, char *err, size_t errlen) {
  char msg[2048];
  size_t at = 0;
  msg_add(msg, sizeof msg, &at, "NVRTC not found: tried ");
  for (size_t i = 0; i < n; i++) {
    char why[512];
    CudaccNvrtc *L = nvrtc_try(&list[i], why, sizeof why);
    if (L) return L;
    const CudaccCandidate *c = &list[i];
    if (!c->path || !c->label || strcmp(c->label, c->path) == 0)
      msg_add(msg, sizeof msg, &at, "%s%s (%s)", i ? ", " : "", c->path ? c->path : c->label ? c->label : "?", why);
    else
      msg_add(msg, sizeof msg, &at, "%s%s=%s (%s)", i ? ", " : "", c->label, c->path, why);
  }
  if (!n) msg_add(msg, sizeof msg, &at, "nothing");
  msg_add(msg, sizeof msg, &at, "; install the CUDA toolkit or set HPDL_NVRTC to the path of libnvrtc.so");
  seterr(err, errlen, "%s", msg);
  return NULL;
}

const char *cudacc_nvrtc_path(const CudaccNvrtc *L) { return L ? L->path : NULL; }

int cudacc_nvrtc_version(const CudaccNvrtc *L, int *major, int *minor) {
  if (!L) return -1;
  if (major) *major = L->major;
  if (minor) *minor = L->minor;
  return 0;
}

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static CudaccNvrtc *g_nvrtc; /* the process's NVRTC, never closed */

const CudaccNvrtc *cudacc_nvrtc(char *err, size_t errlen) {
  pthread_mutex_lock(&g_lock);
  if (!g_nvrtc) {
    CudaccCandidate list[CUDACC_MAX_CANDIDATES];
    char buf[PATH_MAX];
    size_t n = cudacc_nvrtc_candidates(list, CUDACC_MAX_CANDIDATES, buf, sizeof buf);
    g_nvrtc = cudacc_nvrtc_open(list, n, err, errlen); /* a failure is not remembered: the environment may change */
  }
  CudaccNvrtc *L = g_nvrtc;
  pthread_mutex_unlock(&g_lock);
  return L;
}

/* The identity of the NVRTC a compile would use, without opening it when it
 * is found by path. NULL when none can be found (err says why). */
static char *nvrtc_probe_identity(char *err, size_t errlen) {
  pthread_mutex_lock(&g_lock);
  char *id = g_nvrtc ? xstrdup(g_nvrtc->identity) : NULL;
  pthread_mutex_unlock(&g_lock);
  if (id) return id;
  CudaccCandidate list[CUDACC_MAX_CANDIDATES];
  char buf[PATH_MAX];
  size_t n = cudacc_nvrtc_candidates(list, CUDACC_MAX_CANDIDATES, buf, sizeof buf);
  for (size_t i = 0; i < n; i++) {
    const char *p = list[i].path;
    if (!p) continue;
    if (!strchr(p, '/')) break; /* a soname: only the loader knows which file */
    struct stat st;
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) return file_identity(p);
  }
  const CudaccNvrtc *L = cudacc_nvrtc(err, errlen);
  return L ? xstrdup(L->identity) : NULL;
}

/* ---- the request: arch, options, key ------------------------------------ */

/* "sm_90a" -> 90; 0 for anything but sm_<digits>[a|f]. */
static int arch_sm(const char *arch) {
  if (!arch || strncmp(arch, "sm_", 3) != 0) return 0;
  const char *p = arch + 3;
  int sm = 0, digits = 0;
  for (; *p >= '0' && *p <= '9' && digits < 4; p++, digits++) sm = sm * 10 + (*p - '0');
  if (!digits || sm < 10) return 0;
  if (*p == 'a' || *p == 'f') p++;
  return *p ? 0 : sm;
}

static int opt_add(CudaccResult *r, const char *a, const char *b) {
  size_t n = strlen(a) + (b ? strlen(b) : 0) + 1;
  char *s = malloc(n);
  char **v = realloc(r->options, (r->n_options + 1) * sizeof *v);
  if (!s || !v) {
    free(s);
    if (v) r->options = v;
    return -1;
  }
  snprintf(s, n, "%s%s", a, b ? b : "");
  r->options = v;
  r->options[r->n_options++] = s;
  return 0;
}

/* cudacc's options first, in a fixed order, then the caller's: the list is
 * part of the key, so the same request always gives the same list. */
static int build_options(const CudaccRequest *req, CudaccResult *r) {
  int bad = opt_add(r, "--gpu-architecture=", req->arch);
  bad |= opt_add(r, "--std=c++17", NULL);          /* NVRTC's default today; pinned so it cannot drift */
  bad |= opt_add(r, "--ptxas-options=-v", NULL);   /* per-kernel registers, smem, spills in the log */
  for (size_t i = 0; i < req->n_include_dirs; i++)
    if (req->include_dirs[i]) bad |= opt_add(r, "--include-path=", req->include_dirs[i]);
  for (size_t i = 0; i < req->n_options; i++)
    if (req->options[i]) bad |= opt_add(r, req->options[i], NULL);
  return bad ? -1 : 0;
}

/* Reads a whole file; NULL (errno set) on failure. */
static char *read_file(const char *path, size_t *n, size_t max) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  struct stat st;
  char *buf = NULL;
  if (fstat(fileno(f), &st) != 0) goto out;
  if (st.st_size < 0 || (uint64_t)st.st_size > max) {
    errno = EFBIG;
    goto out;
  }
  buf = malloc((size_t)st.st_size + 1);
  if (!buf) goto out;
  *n = fread(buf, 1, (size_t)st.st_size, f);
  buf[*n] = 0;
  if (*n != (size_t)st.st_size) {
    free(buf);
    buf = NULL;
    errno = EIO;
  }
out:
  fclose(f);
  return buf;
}

enum { INC_MAX_FILES = 8192, INC_MAX_DEPTH = 64, INC_MAX_BYTES = 64 << 20 };

/* The headers a source reaches, hashed into the key (see cudacc.h). */

/* The #include lines of a text as "\"name\0<name\0...\0": the quote says
 * how it was written. Lines only; #if and comments are not interpreted, so
 * the list may hold more than the preprocessor reads, never less (but for
 * an #include of a macro). NULL when out of memory. */
static char *scan_includes(const char *text) {
  size_t cap = 64, n = 0;
  char *list = malloc(cap);
  if (!list) return NULL;
  for (const char *p = text; *p;) {
    const char *eol = strchr(p, '\n');
    if (!eol) eol = p + strlen(p);
    const char *q = p;
    while (q < eol && (*q == ' ' || *q == '\t')) q++;
    if (q < eol && *q == '#') {
      q++;
      while (q < eol && (*q == ' ' || *q == '\t')) q++;
      size_t kw = strncmp(q, "include_next", 12) == 0 ? 12 : strncmp(q, "include", 7) == 0 ? 7 : 0;
      q += kw;
      while (kw && q < eol && (*q == ' ' || *q == '\t')) q++;
      char close = !kw || q >= eol ? 0 : *q == '"' ? '"' : *q == '<' ? '>' : 0;
      const char *e = close ? memchr(q + 1, close, (size_t)(eol - q - 1)) : NULL;
      if (e && e > q + 1) {
        size_t len = (size_t)(e - q); /* the opening quote, the name */
        if (n + len + 2 > cap) {
          while (n + len + 2 > cap) cap *= 2;
          char *v = realloc(list, cap);
          if (!v) return free(list), NULL;
          list = v;
        }
        memcpy(list + n, q, len);
        list[n + len] = 0;
        n += len + 1;
      }
    }
    p = *eol ? eol + 1 : eol;
  }
  list[n] = 0;
  return list;
}

/* What one header contributes, remembered per process while its size, mtime
 * and inode hold (hpdlc compiles many modules against the same headers).
 * As in git's racy-file rule, a file modified less than 2 s before it was
 * read is read again next time: an edit within the same mtime tick would
 * otherwise go unseen. Entries are never freed (another thread may be
 * reading one): a changed file gets a new entry in front. */
typedef struct HeaderMemo {
  struct HeaderMemo *next;
  char *path; /* canonical */
  struct stat st;
  time_t read_at;
  unsigned char digest[32]; /* SHA-256 of the text */
  char *includes;           /* scan_includes */
} HeaderMemo;

static pthread_mutex_t g_memo_lock = PTHREAD_MUTEX_INITIALIZER;
static HeaderMemo *g_memo;

static const HeaderMemo *header_memo(const char *real) {
  struct stat st;
  if (stat(real, &st) != 0) return NULL;
  pthread_mutex_lock(&g_memo_lock);
  HeaderMemo *m = g_memo;
  for (; m; m = m->next)
    if (strcmp(m->path, real) == 0) break;
  pthread_mutex_unlock(&g_memo_lock);
  if (m && m->st.st_mtim.tv_sec + 2 <= m->read_at && m->st.st_size == st.st_size && m->st.st_ino == st.st_ino && m->st.st_dev == st.st_dev &&
      m->st.st_mtim.tv_sec == st.st_mtim.tv_sec && m->st.st_mtim.tv_nsec == st.st_mtim.tv_nsec)
    return m;
  size_t n = 0;
  time_t read_at = time(NULL);
  char *text = read_file(real, &n, INC_MAX_BYTES);
  if (!text) return NULL;
  m = calloc(1, sizeof *m);
  if (m && (m->path = xstrdup(real)) && (m->includes = scan_includes(text))) {
    Sha256 h;
    sha_init(&h);
    sha_update(&h, text, n);
    sha_final(&h, m->digest);
    m->st = st;
    m->read_at = read_at;
    free(text);
    pthread_mutex_lock(&g_memo_lock);
    m->next = g_memo;
    g_memo = m;
    pthread_mutex_unlock(&g_memo_lock);
    return m;
  }
  free(text);
  if (m) free(m->path), free(m->includes), free(m);
  return NULL;
}

typedef struct {
  const CudaccRequest *req;
  char **seen; /* canonical paths already hashed */
  size_t n_seen;
  int overflow; /* too many, too deep or unreadable: the key cannot be trusted */
} Includes;

static void hash_include_list(Sha256 *h, Includes *I, const char *list, const char *dir, int depth);

/* Resolves one #include as NVRTC does and hashes what it names. */
static void hash_include(Sha256 *h, Includes *I, const char *name, int quoted, const char *dir, int depth) {
  char path[PATH_MAX], real[PATH_MAX];
  int found = 0;
  size_t nd = I->req->n_include_dirs;
  for (size_t i = 0; !found && i <= nd; i++) {
    int k;
    if (name[0] == '/') {
      if (i) break;
      k = snprintf(path, sizeof path, "%s", name);
    } else if (i == 0) { /* quoted: next to the includer; the source's is the working directory */
      if (!quoted) continue;
      k = snprintf(path, sizeof path, "%s%s%s", dir ? dir : "", dir ? "/" : "", name);
    } else {
      const char *d = I->req->include_dirs[i - 1];
      if (!d) continue;
      k = snprintf(path, sizeof path, "%s/%s", d, name);
    }
    struct stat st;
    found = k > 0 && (size_t)k < sizeof path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
  }
  if (!found) { /* one of NVRTC's built-in headers: the library identity covers it */
    sha_str(h, "builtin");
    sha_str(h, name);
    return;
  }
  if (!realpath(path, real)) {
    I->overflow = 1;
    return;
  }
  /* By content and order, never by path (an artifact's copies of kernels/
   * key as the originals do): a header met again by the ordinal of its first
   * meeting, so #pragma once, which goes by file, keys the same way. */
  for (size_t i = 0; i < I->n_seen; i++)
    if (strcmp(I->seen[i], real) == 0) { /* its text is in the hash already */
      char again[32];
      snprintf(again, sizeof again, "again %zu", i);
      sha_str(h, again);
      return;
    }
  sha_str(h, "file");
  char **v = realloc(I->seen, (I->n_seen + 1) * sizeof *v);
  if (!v) {
    I->overflow = 1;
    return;
  }
  I->seen = v;
  const HeaderMemo *m;
  if (I->n_seen >= INC_MAX_FILES || depth >= INC_MAX_DEPTH || !(I->seen[I->n_seen] = xstrdup(real)) ||
      !(m = header_memo(real))) {
    I->overflow = 1;
    return;
  }
  I->n_seen++;
  sha_update(h, m->digest, 32);
  char *slash = strrchr(real, '/');
  if (slash) *slash = 0;
  hash_include_list(h, I, m->includes, slash ? (slash == real ? "/" : real) : NULL, depth + 1);
}

static void hash_include_list(Sha256 *h, Includes *I, const char *list, const char *dir, int depth) {
  for (const char *p = list; *p && !I->overflow; p += strlen(p) + 1) hash_include(h, I, p + 1, *p == '"', dir, depth);
}

/* key = SHA-256(tag, arch, options, source, headers' digest, NVRTC identity).
 * An include directory counts by the headers found there (their contents are
 * in the digest), not by its name: the CUDA back end compiles against the
 * copies of kernels/ in each artifact's own folder, and the same source
 * compiled into another folder must hit. */
static void make_key(const CudaccResult *r, const CudaccRequest *req, const unsigned char inc[32],
                     const char *identity, unsigned char key[32]) {
  static const char include_opt[] = "--include-path=";
  Sha256 h;
  sha_init(&h);
  sha_str(&h, "hpdl-cudacc-2");
  sha_str(&h, req->arch);
  for (size_t i = 0; i < r->n_options; i++)
    sha_str(&h, strncmp(r->options[i], include_opt, sizeof include_opt - 1) == 0 ? include_opt : r->options[i]);
  sha_str(&h, "source");
  sha_str(&h, req->source);
  sha_update(&h, inc, 32);
  sha_str(&h, identity);
  sha_final(&h, key);
}

/* ---- the cache ---------------------------------------------------------- */

static void warn(CudaccResult *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(CudaccResult *r, const char *fmt, ...) {
  if (r->warning) return; /* once: the first problem is the one to fix */
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  r->warning = xstrdup(buf);
}

int cudacc_cache_dir(char *buf, size_t n) {
  const char *v;
  int k;
  if ((v = getenv("HPDL_CACHE")) && *v)
    k = snprintf(buf, n, "%s", v);
  else if ((v = getenv("XDG_CACHE_HOME")) && *v)
    k = snprintf(buf, n, "%s/hpdl/nvrtc", v);
  else if ((v = getenv("HOME")) && *v)
    k = snprintf(buf, n, "%s/.cache/hpdl/nvrtc", v);
  else
    return -1;
  return k > 0 && (size_t)k < n ? 0 : -1;
}

long long cudacc_cache_limit(void) {
  const char *v = getenv("HPDL_CACHE_SIZE");
  long long def = (long long)CUDACC_CACHE_SIZE_DEFAULT_MB << 20;
  if (!v || !*v) return def;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  double unit = 1;
  if (*end == 'K' || *end == 'k') unit = 1024.0, end++;
  else if (*end == 'M' || *end == 'm') unit = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g') unit = 1024.0 * 1024 * 1024, end++;
  if (end == v || *end || errno || !(x >= 0) || x * unit > 9e18) return -1;
  return (long long)(x * unit);
}

void cudacc_cache_touch(const char *path) { utimensat(AT_FDCWD, path, NULL, 0); }

typedef struct {
  char *path;
  long long bytes;
  struct timespec used;
} CacheFile;

/* name is `hex` hexadecimal digits followed by suffix exactly */
static int hex_named(const char *name, size_t hex, const char *suffix) {
  for (size_t i = 0; i < hex; i++)
    if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return 0;
  return !strcmp(name + hex, suffix);
}

/* Appends the cache's entries below dir: the files named as the cache
 * names them and nothing else (HPDL_CACHE may name a folder that holds
 * other things too): NVRTC's in two-digit folders (xx/<64 hex>.hnvc), the
 * emulation's in emu/ (<64 hex>.so). A store in progress has another name. */
static void cache_walk(const char *dir, int emu, int depth, CacheFile **files, size_t *n, size_t *cap, long long *total) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *nm = e->d_name;
    int sub = depth == 0 && (hex_named(nm, 2, "") || !strcmp(nm, "emu"));
    int entry = depth == 1 && (emu ? hex_named(nm, 64, ".so") : hex_named(nm, 64, ".hnvc"));
    if (!sub && !entry) continue;
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", dir, nm) >= (int)sizeof p) continue;
    struct stat st;
    if (lstat(p, &st) != 0) continue;
    if (sub && S_ISDIR(st.st_mode)) {
      cache_walk(p, !strcmp(nm, "emu"), 1, files, n, cap, total);
    } else if (entry && S_ISREG(st.st_mode)) {
      if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 256;
        CacheFile *g = realloc(*files, nc * sizeof *g);
        if (!g) break;
        *files = g, *cap = nc;
      }
      char *copy = strdup(p);
      if (!copy) break;
      (*files)[(*n)++] = (CacheFile){copy, (long long)st.st_size, st.st_mtim};
      *total += (long long)st.st_size;
    }
  }
  closedir(d);
}

static int older_first(const void *a, const void *b) {
  const CacheFile *x = a, *y = b;
  if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
  if (x->used.tv_nsec != y->used.tv_nsec) return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
  return strcmp(x->path, y->path);
}

int cudacc_cache_trim(const char *dir, const char *keep) {
  long long limit = cudacc_cache_limit();
  if (limit < 0) limit = (long long)CUDACC_CACHE_SIZE_DEFAULT_MB << 20;
  if (limit == 0) return 0;
  CacheFile *files = NULL;
  size_t n = 0, cap = 0;
  long long total = 0;
  int removed = 0;
  cache_walk(dir, 0, 0, &files, &n, &cap, &total);
  if (total > limit) {
    qsort(files, n, sizeof *files, older_first);
    for (size_t i = 0; i < n && total > limit / 10 * 8; i++)
      if (!(keep && !strcmp(files[i].path, keep)) && unlink(files[i].path) == 0) {
        total -= files[i].bytes;
        removed++;
      }
  }
  for (size_t i = 0; i < n; i++) free(files[i].path);
  free(files);
  return removed;
}

enum { ENTRY_HEAD = 80, ENTRY_FORMAT = 1 };
static const char entry_magic[8] = {'H', 'P', 'D', 'L', 'N', 'V', 'C', '1'};

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> 8 * i);
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> 8 * i);
}
static uint32_t get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* 0, or -1 when the path does not fit. */
static int entry_path(char *buf, size_t n, const char *dir, const char *hex) {
  int k = snprintf(buf, n, "%s/%.2s/%s.hnvc", dir, hex, hex);
  return k > 0 && (size_t)k < n ? 0 : -1;
}

/* Reads the entry for key into r. 1: a hit; 0: none; -1: present but not
 * usable (why says what; the caller recompiles over it). */
static int cache_read(const char *path, const unsigned char key[32], CudaccResult *r, char *why, size_t whylen) {
  size_t n = 0;
  errno = 0;
  unsigned char *d = (unsigned char *)read_file(path, &n, (size_t)1 << 32);
  if (!d) {
    if (errno == ENOENT || errno == ENOTDIR) return 0;
    seterr(why, whylen, "unreadable: %s", strerror(errno));
    return -1;
  }
  int rc = -1;
  unsigned char sum[32];
  Sha256 h;
  if (n < ENTRY_HEAD + 32) {
    seterr(why, whylen, "truncated: %zu bytes", n);
    goto out;
  }
  if (memcmp(d, entry_magic, 8) != 0 || get32(d + 8) != ENTRY_FORMAT) {
    seterr(why, whylen, "not a cache entry of this format");
    goto out;
  }
  if (memcmp(d + 24, key, 32) != 0) {
    seterr(why, whylen, "holds another key");
    goto out;
  }
  uint64_t lc = get64(d + 56), lp = get64(d + 64), ll = get64(d + 72), body = n - ENTRY_HEAD - 32;
  if (lc > body || lp > body - lc || ll > body - lc - lp || lc + lp + ll != body) {
    seterr(why, whylen, "truncated: %zu bytes, its header says %llu", n,
           (unsigned long long)(ENTRY_HEAD + 32 + lc + lp + ll));
    goto out;
  }
  sha_init(&h);
  sha_update(&h, d, n - 32);
  sha_final(&h, sum);
  if (memcmp(sum, d + n - 32, 32) != 0) {
    seterr(why, whylen, "checksum mismatch");
    goto out;
  }
  const unsigned char *p = d + ENTRY_HEAD;
  char eerr[256];
  if (cudacc_elf_check(p, (size_t)lc, NULL, eerr, sizeof eerr) != 0) {
    seterr(why, whylen, "bad cubin: %s", eerr);
    goto out;
  }
  r->cubin = malloc(lc ? lc : 1);
  r->ptx = malloc(lp + 1);
  char *log = malloc(ll + 1);
  if (!r->cubin || !r->ptx || !log) {
    free(log);
    seterr(why, whylen, "out of memory");
    goto out;
  }
  memcpy(r->cubin, p, lc), r->cubin_size = lc, p += lc;
  memcpy(r->ptx, p, lp), r->ptx[lp] = 0, r->ptx_size = lp, p += lp;
  memcpy(log, p, ll), log[ll] = 0;
  free(r->log);
  r->log = log;
  r->nvrtc_major = (int)get32(d + 12);
  r->nvrtc_minor = (int)get32(d + 16);
  rc = 1;
out:
  free(d);
  return rc;
}

/* mkdir -p; 0 or -1 with errno. */
static int make_dirs(const char *dir) {
  char p[PATH_MAX];
  size_t n = strlen(dir);
  if (n >= sizeof p) return errno = ENAMETOOLONG, -1;
  memcpy(p, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != 0) continue;
    char c = p[i];
    p[i] = 0;
    if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
    p[i] = c;
  }
  struct stat st;
  if (stat(p, &st) != 0) return -1;
  return S_ISDIR(st.st_mode) ? 0 : (errno = ENOTDIR, -1);
}

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k, n -= (size_t)k;
  }
  return 0;
}

/* Stores r under key: a unique temporary file in the entry's own folder,
 * fsync, rename (atomic within a file system), fsync of the folder. */
static void cache_write(const char *dir, const char *hex, const unsigned char key[32], CudaccResult *r) {
  char sub[PATH_MAX], tmp[PATH_MAX], path[PATH_MAX];
  int k = snprintf(sub, sizeof sub, "%s/%.2s", dir, hex);
  int k2 = snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", sub, hex);
  if (k < 0 || (size_t)k >= sizeof sub || k2 < 0 || (size_t)k2 >= sizeof tmp ||
      entry_path(path, sizeof path, dir, hex) != 0) {
    warn(r, "NVRTC cache not written: the path of an entry in %s is too long", dir);
    return;
  }
  if (make_dirs(sub) != 0) {
    warn(r, "NVRTC cache not written: cannot create %s: %s", sub, strerror(errno));
    return;
  }
  int fd = mkstemp(tmp);
  if (fd < 0) {
    warn(r, "NVRTC cache not written: cannot create a file in %s: %s", sub, strerror(errno));
    return;
  }
  size_t ll = strlen(r->log);
  unsigned char head[ENTRY_HEAD] = {0}, sum[32];
  memcpy(head, entry_magic, 8);
  put32(head + 8, ENTRY_FORMAT);
  put32(head + 12, (uint32_t)r->nvrtc_major);
  put32(head + 16, (uint32_t)r->nvrtc_minor);
  memcpy(head + 24, key, 32);
  put64(head + 56, r->cubin_size);
  put64(head + 64, r->ptx_size);
  put64(head + 72, ll);
  Sha256 h;
  sha_init(&h);
  sha_update(&h, head, sizeof head);
  sha_update(&h, r->cubin, r->cubin_size);
  sha_update(&h, r->ptx, r->ptx_size);
  sha_update(&h, r->log, ll);
  sha_final(&h, sum);
  const char *step = "write";
  if (fchmod(fd, 0644) != 0 || write_all(fd, head, sizeof head) || write_all(fd, r->cubin, r->cubin_size) ||
      write_all(fd, r->ptx, r->ptx_size) || write_all(fd, r->log, ll) || write_all(fd, sum, 32) ||
      (step = "fsync", fsync(fd) != 0)) {
    int e = errno;
    close(fd);
    unlink(tmp);
    warn(r, "NVRTC cache not written: %s %s: %s", step, tmp, strerror(e));
    return;
  }
  if (close(fd) != 0 || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    warn(r, "NVRTC cache not written: rename to %s: %s", path, strerror(e));
    return;
  }
  int dfd = open(sub, O_RDONLY);
  if (dfd >= 0) { /* the rename itself survives a crash; best effort */
    fsync(dfd);
    close(dfd);
  }
}

/* ---- ptxas -v --------------------------------------------------------- */

/* The number right before `unit` in [line, eol), or -1. */
static long num_before(const char *line, const char *eol, const char *unit) {
  size_t ul = strlen(unit);
  for (const char *p = line; p + ul <= eol; p++) {
    if (memcmp(p, unit, ul) != 0) continue;
    const char *q = p;
    while (q > line && q[-1] >= '0' && q[-1] <= '9') q--;
    if (q == p) continue;
    return strtol(q, NULL, 10);
  }
  return -1;
}

static const char *find_in(const char *line, const char *eol, const char *s) {
  size_t n = strlen(s);
  for (const char *p = line; p + n <= eol; p++)
    if (memcmp(p, s, n) == 0) return p + n;
  return NULL;
}

/* ptxas's report, per entry function:
 *   ptxas info    : Compiling entry function 'NAME' for 'sm_90'
 *   ptxas info    : Function properties for NAME
 *   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 14 registers, used 1 barriers, 128 bytes smem[, 372 bytes cmem[0]]
 * Properties of a non-entry function (name differs) are skipped. */
static int parse_ptxas(const char *log, CudaccResult *r) {
  CudaccKernelInfo *cur = NULL;
  int props = 0;
  for (const char *p = log; *p;) {
    const char *eol = strchr(p, '\n');
    if (!eol) eol = p + strlen(p);
    const char *s;
    if ((s = find_in(p, eol, "Compiling entry function '"))) {
      const char *e = memchr(s, '\'', (size_t)(eol - s));
      CudaccKernelInfo *v = realloc(r->kernels, (r->n_kernels + 1) * sizeof *v);
      if (!e || !v) return -1;
      r->kernels = v;
      cur = &v[r->n_kernels++];
      memset(cur, 0, sizeof *cur);
      if (!(cur->name = malloc((size_t)(e - s) + 1))) return -1;
      memcpy(cur->name, s, (size_t)(e - s));
      cur->name[e - s] = 0;
      props = 0;
    } else if ((s = find_in(p, eol, "Function properties for "))) {
      size_t n = (size_t)(eol - s);
      while (n && (s[n - 1] == ' ' || s[n - 1] == '\r')) n--;
      props = cur && strlen(cur->name) == n && memcmp(cur->name, s, n) == 0;
    } else if (find_in(p, eol, "bytes stack frame")) {
      if (props) {
        cur->stack = num_before(p, eol, " bytes stack frame");
        cur->spill_store = num_before(p, eol, " bytes spill stores");
        cur->spill_load = num_before(p, eol, " bytes spill loads");
      }
    } else if (cur && find_in(p, eol, "Used ") && find_in(p, eol, " registers")) {
      long v = num_before(p, eol, " registers");
      cur->registers = v > 0 ? (int)v : 0;
      v = num_before(p, eol, " barriers");
      cur->barriers = v > 0 ? (int)v : 0;
      v = num_before(p, eol, " bytes smem");
      cur->smem_bytes = v > 0 ? v : 0;
    }
    p = *eol ? eol + 1 : eol;
  }
  return 0;
}

/* ---- compile ----------------------------------------------------------- */

/* The first line of the log that reports an error. */
static void first_error(const char *log, char *buf, size_t n) {
  const char *best = NULL, *best_eol = NULL;
  for (const char *p = log; *p && !best;) {
    const char *eol = strchr(p, '\n');
    if (!eol) eol = p + strlen(p);
    if (find_in(p, eol, ": error") || find_in(p, eol, "error:")) best = p, best_eol = eol;
    p = *eol ? eol + 1 : eol;
  }
  if (!best) {
    snprintf(buf, n, "no error line in the log");
    return;
  }
  snprintf(buf, n, "%.*s", (int)(best_eol - best), best);
}

/* One NVRTC run over the result's options; fills cubin, PTX and log. */
static int nvrtc_run(const CudaccNvrtc *L, const CudaccRequest *req, const char *name, CudaccResult *r,
                     char *err, size_t errlen) {
  NvrtcProgram prog = NULL;
  size_t n = 0;
  int rc = -1;
  NVRTC_CHECK(L, nvrtcVersion(&r->nvrtc_major, &r->nvrtc_minor));
  NVRTC_CHECK(L, nvrtcCreateProgram(&prog, req->source, name, 0, NULL, NULL));
  NvrtcResult crc = L->nvrtcCompileProgram(prog, (int)r->n_options, (const char *const *)r->options);
  NVRTC_CHECK(L, nvrtcGetProgramLogSize(prog, &n));
  char *log = malloc(n + 1);
  if (!log) {
    seterr(err, errlen, "out of memory for a %zu-byte NVRTC log", n);
    goto fail;
  }
  log[0] = log[n] = 0;
  free(r->log);
  r->log = log;
  if (n) NVRTC_CHECK(L, nvrtcGetProgramLog(prog, log));
  if (crc != 0) { /* the CHECK message, then the line that says what is wrong */
    char first[512];
    size_t at;
    nvrtc_fail(L, crc, "nvrtcCompileProgram(prog, n_options, options)", __FILE__, __LINE__, err, errlen);
    first_error(log, first, sizeof first);
    at = err ? strlen(err) : 0;
    if (err && at + 1 < errlen) snprintf(err + at, errlen - at, ": %s (full log in the result)", first);
    goto fail;
  }
  NVRTC_CHECK(L, nvrtcGetCUBINSize(prog, &n));
  free(r->cubin);
  if (!(r->cubin = malloc(n ? n : 1))) goto oom;
  r->cubin_size = n;
  if (n) NVRTC_CHECK(L, nvrtcGetCUBIN(prog, (char *)r->cubin));
  NVRTC_CHECK(L, nvrtcGetPTXSize(prog, &n));
  free(r->ptx);
  if (!(r->ptx = malloc(n + 1))) goto oom;
  r->ptx[0] = r->ptx[n] = 0;
  if (n) NVRTC_CHECK(L, nvrtcGetPTX(prog, r->ptx));
  r->ptx_size = strlen(r->ptx);
  rc = 0;
  goto fail;
oom:
  seterr(err, errlen, "out of memory for NVRTC's output");
fail:
  if (prog) L->nvrtcDestroyProgram(&prog);
  return rc;
}

static void result_init(CudaccResult *r) {
  memset(r, 0, sizeof *r);
  r->log = xstrdup("");
}

int cudacc_compile(const CudaccRequest *req, CudaccResult *out, char *err, size_t errlen) {
  double t0 = now_s();
  int rc = -1;
  char *identity = NULL;
  Includes inc = {req, NULL, 0, 0};
  result_init(out);
  if (!req || !req->source || !req->arch) {
    seterr(err, errlen, "cudacc: no source or no arch");
    goto done;
  }
  const char *name = req->name && *req->name ? req->name : "hpdl.cu";
  if (!(out->sm = arch_sm(req->arch))) {
    seterr(err, errlen, "%s: arch '%s' is not sm_<N>[a|f]: cudacc compiles for a real GPU (the PTX comes with the cubin)",
           name, req->arch);
    goto done;
  }
  if (!out->log || build_options(req, out) != 0) {
    seterr(err, errlen, "%s: out of memory", name);
    goto done;
  }

  /* The key: everything that decides NVRTC's output (cudacc.h). */
  unsigned char incd[32], key[32];
  Sha256 h;
  sha_init(&h);
  char *root = scan_includes(req->source);
  if (root) hash_include_list(&h, &inc, root, NULL, 0);
  else inc.overflow = 1;
  free(root);
  sha_final(&h, incd);
  if (!(identity = nvrtc_probe_identity(err, errlen))) goto done;
  make_key(out, req, incd, identity, key);
  hexify(key, 32, out->hash);

  char dir[PATH_MAX], path[PATH_MAX];
  int cache = req->use_cache;
  if (cache && inc.overflow) {
    warn(out, "NVRTC cache not used: the headers %s includes could not all be read", name);
    cache = 0;
  }
  if (cache && cudacc_cache_dir(dir, sizeof dir) != 0) {
    warn(out, "NVRTC cache not used: none of $HPDL_CACHE, $XDG_CACHE_HOME, $HOME is set");
    cache = 0;
  }
  if (cache) {
    char why[512];
    int got = entry_path(path, sizeof path, dir, out->hash) == 0 ? cache_read(path, key, out, why, sizeof why) : 0;
    if (got == 1 && parse_ptxas(out->log, out) == 0) {
      out->cache_hit = 1;
      cudacc_cache_touch(path);
      rc = 0;
      goto done;
    }
    if (got != 0) warn(out, "NVRTC cache entry %s ignored (%s); recompiled", path, why);
    free(out->cubin), out->cubin = NULL, out->cubin_size = 0;
    free(out->ptx), out->ptx = NULL, out->ptx_size = 0;
    for (size_t i = 0; i < out->n_kernels; i++) free(out->kernels[i].name);
    free(out->kernels), out->kernels = NULL, out->n_kernels = 0;
  }

  const CudaccNvrtc *L = cudacc_nvrtc(err, errlen);
  if (!L) goto done;
  if (strcmp(L->identity, identity) != 0) { /* found by path but another file loaded: key by what compiles */
    make_key(out, req, incd, L->identity, key);
    hexify(key, 32, out->hash);
  }
  if (nvrtc_run(L, req, name, out, err, errlen) != 0) goto done;
  if (!out->ptx_size) {
    seterr(err, errlen, "%s: NVRTC %d.%d returned no PTX for %s", name, out->nvrtc_major, out->nvrtc_minor,
           req->arch);
    goto done;
  }
  int sm = 0;
  char eerr[256];
  if (cudacc_elf_check(out->cubin, out->cubin_size, &sm, eerr, sizeof eerr) != 0 || sm != out->sm) {
    seterr(err, errlen, "%s: NVRTC's cubin for %s: %s", name, req->arch, sm ? "wrong SM" : eerr);
    goto done;
  }
  if (parse_ptxas(out->log, out) != 0) {
    seterr(err, errlen, "%s: out of memory", name);
    goto done;
  }
  if (cache) {
    cache_write(dir, out->hash, key, out);
    if (cudacc_cache_limit() < 0)
      warn(out, "HPDL_CACHE_SIZE=%s is not a size (a number, optionally with K, M or G; 0: no limit): the cache keeps to %d M",
           getenv("HPDL_CACHE_SIZE"), (int)CUDACC_CACHE_SIZE_DEFAULT_MB);
    cudacc_cache_trim(dir, path);
  }
  rc = 0;
done:
  for (size_t i = 0; i < inc.n_seen; i++) free(inc.seen[i]);
  free(inc.seen);
  free(identity);
  out->seconds = now_s() - t0;
  return rc;
}

void cudacc_result_free(CudaccResult *r) {
  if (!r) return;
  free(r->cubin);
  free(r->ptx);
  for (size_t i = 0; i < r->n_options; i++) free(r->options[i]);
  free(r->options);
  free(r->log);
  for (size_t i = 0; i < r->n_kernels; i++) free(r->kernels[i].name);
  free(r->kernels);
  free(r->warning);
  memset(r, 0, sizeof *r);
}

/* ---- cubin ------------------------------------------------------------- */

/* How a cubin names its SM in e_flags (checked on NVRTC 13.0's output for
 * sm_75, 80, 86, 90, 90a, 100, 100a, 120): the ELF ABI version
 * (e_ident[EI_ABIVERSION]) says which layout.
 *   ABI 8 (CUDA 12.8 on, EI_OSABI 0x41): SM in bits 8-15. sm_80: 0x06005004,
 *     sm_90: 0x06005a04, sm_100: 0x06006402, sm_120: 0x06007802. The a/f
 *     suffix is not in e_flags (sm_90a gives sm_90's flags).
 *   ABI 7 and older (CUDA up to 12.x): SM in bits 0-7, the virtual SM in
 *     bits 16-23, 0x100 unified textures, 0x400 64-bit addresses: sm_80 is
 *     0x00500550 (cuobjdump's EF_CUDA_SM80 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM80)).
 *     Not checked here on real output: no older toolkit on this machine. */
int cudacc_elf_check(const void *cubin, size_t n, int *sm_out, char *err, size_t errlen) {
  const unsigned char *p = cubin;
  if (!p || n < 64) {
    seterr(err, errlen, "not a cubin: %zu bytes, shorter than an ELF header", n);
    return -1;
  }
  if (memcmp(p, "\177ELF", 4) != 0) {
    seterr(err, errlen, "not a cubin: no ELF magic");
    return -1;
  }
  if (p[4] != 2 || p[5] != 1) {
    seterr(err, errlen, "not a cubin: ELF class %d, data %d (want 64-bit little-endian)", p[4], p[5]);
    return -1;
  }
  unsigned machine = (unsigned)p[18] | (unsigned)p[19] << 8;
  if (machine != 190) {
    seterr(err, errlen, "not a cubin: e_machine %u, not EM_CUDA (190)", machine);
    return -1;
  }
  uint64_t phoff = get64(p + 32), shoff = get64(p + 40);
  unsigned phentsize = (unsigned)p[54] | (unsigned)p[55] << 8, phnum = (unsigned)p[56] | (unsigned)p[57] << 8;
  unsigned shentsize = (unsigned)p[58] | (unsigned)p[59] << 8, shnum = (unsigned)p[60] | (unsigned)p[61] << 8;
  if ((phnum && (phoff > n || (uint64_t)phnum * phentsize > n - phoff)) ||
      (shnum && (shoff > n || (uint64_t)shnum * shentsize > n - shoff))) {
    seterr(err, errlen, "truncated cubin: its headers reach past its %zu bytes", n);
    return -1;
  }
  uint32_t flags = get32(p + 48);
  int sm = p[8] >= 8 ? (int)(flags >> 8 & 0xff) : (int)(flags & 0xff);
  if (sm < 10) {
    seterr(err, errlen, "cubin names no SM: e_flags 0x%08x, ELF ABI version %d", flags, p[8]);
    return -1;
  }
  if (sm_out) *sm_out = sm;
  return 0;
}
