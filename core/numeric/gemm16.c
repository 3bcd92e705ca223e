/* gemm16.c - bf16 GEMMs through oneDNN's matmul, or widened to fp32
 * (gemm16.h). */
#include "gemm16.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"

#ifdef HPDL_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#if !defined(DNNL_VERSION_MAJOR) || DNNL_VERSION_MAJOR != 2
#undef HPDL_HAVE_DNNL /* oneDNN 3 replaced the operation descriptors used here */
#endif
#endif

#ifdef HPDL_HAVE_DNNL
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* the state below and oneDNN's objects */
static char backend[160] = "fp32 sgemm: oneDNN not tried yet";
#else
static char backend[160] = "fp32 sgemm: built without oneDNN 2's header (libdnnl-dev)";
#endif

/* ---- widened to fp32 ---- */

static float *widen(const uint16_t *x, int64_t rows, int64_t cols, int64_t ld) {
  float *w = malloc(sizeof(float) * (size_t)(rows * cols > 0 ? rows * cols : 1));
  if (!w) return NULL;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) w[r * cols + c] = half_bf16_to_f32(x[r * ld + c]);
  return w;
}

static int gemm_widened(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t lda,
                        const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc, Gemm16Sgemm sgemm, char *why,
                        int whylen) {
  /* the stored matrices: op(A) = A^T stores [k, m] */
  int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  float *wa = widen(a, ar, ac, lda), *wb = widen(b, br, bc, ldb);
  if (!wa || !wb) {
    free(wa);
    free(wb);
    snprintf(why, (size_t)whylen, "out of memory widening a bf16 GEMM's operands (%lld x %lld x %lld)", (long long)m,
             (long long)n, (long long)k);
    return -1;
  }
  if (sgemm) {
    sgemm(ta, tb, m, n, k, alpha, wa, ac, wb, bc, beta, c, ldc);
  } else {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        float s = 0;
        for (int64_t p = 0; p < k; p++) s += (ta ? wa[p * ac + i] : wa[i * ac + p]) * (tb ? wb[j * bc + p] : wb[p * bc + j]);
        c[i * ldc + j] = alpha * s + (beta != 0 ? beta * c[i * ldc + j] : 0);
      }
  }
  free(wa);
  free(wb);
  return 0;
}

#ifdef HPDL_HAVE_DNNL

/* ---- oneDNN, opened at run time ---- */

/* The functions used, with the header's own types. */
#define DNNL_FUNCS(X)                                                                                                  \
  X(dnnl_version)                                                                                                      \
  X(dnnl_engine_create)                                                                                                \
  X(dnnl_stream_create)                                                                                                \
  X(dnnl_memory_desc_init_by_strides)                                                                                  \
  X(dnnl_matmul_desc_init)                                                                                             \
  X(dnnl_primitive_attr_create)                                                                                        \
  X(dnnl_primitive_attr_destroy)                                                                                       \
  X(dnnl_primitive_attr_set_output_scales)                                                                             \
  X(dnnl_primitive_attr_set_post_ops)                                                                                  \
  X(dnnl_post_ops_create)                                                                                              \
  X(dnnl_post_ops_destroy)                                                                                             \
  X(dnnl_post_ops_append_sum)                                                                                          \
  X(dnnl_primitive_desc_create)                                                                                        \
  X(dnnl_primitive_desc_destroy)                                                                                       \
  X(dnnl_primitive_desc_query)                                                                                         \
  X(dnnl_primitive_create)                                                                                             \
  X(dnnl_memory_create)                                                                                                \
  X(dnnl_memory_set_data_handle)                                                                                       \
  X(dnnl_primitive_execute)                                                                                            \
  X(dnnl_primitive_destroy)                                                                                            \
  X(dnnl_memory_destroy)                                                                                               \
  X(dnnl_stream_destroy)                                                                                               \
  X(dnnl_engine_destroy)                                                                                               \
  X(dnnl_stream_wait)

#define DNNL_PTR(f) static __typeof__(&f) p_##f;
DNNL_FUNCS(DNNL_PTR)
#undef DNNL_PTR

static void (*p_omp_set_num_threads)(int);
static int dnnl_state; /* 0 not tried, 1 ready, -1 unavailable */
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static int omp_threads;

/* A matmul of one shape, its memory objects given data per call. */
typedef struct {
  int ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  dnnl_primitive_t prim;
  dnnl_memory_t ma, mb, mc;
} Prim;

enum { MAX_PRIMS = 512 };
static Prim prims[MAX_PRIMS];
static int nprims;

static const char *probe_impl(void);

static void dnnl_open(void) {
  const char *force = getenv("HPDL_GEMM16");
  if (force && !strcmp(force, "fp32")) {
    snprintf(backend, sizeof backend, "fp32 sgemm: HPDL_GEMM16=fp32");
    dnnl_state = -1;
    return;
  }
  dnnl_state = -1;
  /* OpenMP's threads (oneDNN's) spin after each product by default, taking
   * the cores from the kernels that follow on the rank's own threads (a
   * step 2.6x slower on 2 cores); they sleep instead unless the user says
   * otherwise. libgomp reads this when it loads, with oneDNN, just below. */
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(backend, sizeof backend, "fp32 sgemm: oneDNN 2 (libdnnl.so.2) is not installed");
    return;
  }
#define DNNL_SYM(f)                                                                                                    \
  if (!(*(void **)&p_##f = dlsym(h, #f))) {                                                                            \
    snprintf(backend, sizeof backend, "fp32 sgemm: libdnnl.so.2 lacks %s", #f);                                        \
    return;                                                                                                            \
  }
  DNNL_FUNCS(DNNL_SYM)
#undef DNNL_SYM
  *(void **)&p_omp_set_num_threads = dlsym(h, "omp_set_num_threads");
  if (p_dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success ||
      p_dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
    snprintf(backend, sizeof backend, "fp32 sgemm: oneDNN found no CPU engine");
    return;
  }
  const dnnl_version_t *v = p_dnnl_version();
  /* A CPU without bf16 instructions (AVX512-BF16, AMX) gets a kernel that
   * converts as it goes (oneDNN 2.6's gemm:jit: 22 GFLOP/s where sgemm
   * makes 180 on the widened operands, limited to AVX-512 here): then those. */
  const char *impl = probe_impl();
  dnnl_state = 1;
  snprintf(backend, sizeof backend, "oneDNN %d.%d.%d matmul (%.48s)", v->major, v->minor, v->patch, impl ? impl : "?");
  if (!impl || (!strstr(impl, "bf16") && !strstr(impl, "amx"))) {
    snprintf(backend, sizeof backend, "fp32 sgemm: oneDNN %d.%d.%d has no bf16 kernel for this CPU%s%.48s%s", v->major,
             v->minor, v->patch, impl ? " (it would run " : "", impl ? impl : "", impl ? ")" : "");
    p_dnnl_stream_destroy(stream);
    p_dnnl_engine_destroy(engine);
    dnnl_state = -1;
  }
}

/* A stored matrix of rows x cols, leading dimension ld, as op() reads it. */
static dnnl_status_t matrix_desc(dnnl_memory_desc_t *d, int trans, int64_t rows, int64_t cols, int64_t ld,
                                 dnnl_data_type_t dt) {
  /* op(X) is [rows, cols] logically; X^T stored [cols, rows] */
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
  return p_dnnl_memory_desc_init_by_strides(d, 2, dims, dt, strides);
}

static Prim *prim_of(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, int64_t lda, int64_t ldb,
                     float beta, int64_t ldc) {
  for (int i = 0; i < nprims; i++) {
    Prim *p = &prims[i];
    if (p->ta == ta && p->tb == tb && p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb &&
        p->ldc == ldc && p->alpha == alpha && p->beta == beta)
      return p;
  }
  if (nprims == MAX_PRIMS) return NULL;
  dnnl_memory_desc_t da, db, dc;
  if (matrix_desc(&da, ta, m, k, lda, dnnl_bf16) || matrix_desc(&db, tb, k, n, ldb, dnnl_bf16) ||
      matrix_desc(&dc, 0, m, n, ldc, dnnl_f32))
    return NULL;
  dnnl_matmul_desc_t md;
  if (p_dnnl_matmul_desc_init(&md, &da, &db, NULL, &dc)) return NULL;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  Prim *p = &prims[nprims];
  *p = (Prim){.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = alpha,
              .beta = beta};
  int ok = p_dnnl_primitive_attr_create(&attr) == dnnl_success;
  if (ok && alpha != 1.0f) ok = p_dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) == dnnl_success;
  if (ok && beta != 0.0f) {
    ok = p_dnnl_post_ops_create(&po) == dnnl_success && p_dnnl_post_ops_append_sum(po, beta) == dnnl_success &&
         p_dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
  }
  ok = ok && p_dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL) == dnnl_success;
  ok = ok && p_dnnl_primitive_create(&p->prim, pd) == dnnl_success;
  ok = ok && p_dnnl_memory_create(&p->ma, &da, engine, DNNL_MEMORY_NONE) == dnnl_success &&
       p_dnnl_memory_create(&p->mb, &db, engine, DNNL_MEMORY_NONE) == dnnl_success &&
       p_dnnl_memory_create(&p->mc, &dc, engine, DNNL_MEMORY_NONE) == dnnl_success;
  if (pd) p_dnnl_primitive_desc_destroy(pd);
  if (po) p_dnnl_post_ops_destroy(po);
  if (attr) p_dnnl_primitive_attr_destroy(attr);
  if (!ok) return NULL; /* what was made stays: a few objects, once */
  nprims++;
  return p;
}

/* The implementation oneDNN picks for a bf16 product on this CPU, from a
 * primitive made and dropped (NULL when it makes none). */
static const char *probe_impl(void) {
  static char impl[96];
  dnnl_memory_desc_t da, db, dc;
  dnnl_matmul_desc_t md;
  dnnl_primitive_desc_t pd = NULL;
  const char *s = NULL;
  if (matrix_desc(&da, 0, 64, 64, 64, dnnl_bf16) || matrix_desc(&db, 0, 64, 64, 64, dnnl_bf16) ||
      matrix_desc(&dc, 0, 64, 64, 64, dnnl_f32) || p_dnnl_matmul_desc_init(&md, &da, &db, NULL, &dc) ||
      p_dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL))
    return NULL;
  if (p_dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s) == dnnl_success && s)
    snprintf(impl, sizeof impl, "%s", s);
  p_dnnl_primitive_desc_destroy(pd);
  return s ? impl : NULL;
}

/* 1: done by oneDNN; 0: not (no library, a shape it refused); -1: failed. */
static int gemm_dnnl(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t lda,
                     const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc, int nthreads, char *why,
                     int whylen) {
  if (!dnnl_state) dnnl_open();
  if (dnnl_state < 0) return 0;
  Prim *p = prim_of(ta, tb, m, n, k, alpha, lda, ldb, beta, ldc);
  if (!p) return 0;
  if (nthreads > 0 && nthreads != omp_threads && p_omp_set_num_threads) {
    p_omp_set_num_threads(nthreads);
    omp_threads = nthreads;
  }
  if (p_dnnl_memory_set_data_handle(p->ma, (void *)a) || p_dnnl_memory_set_data_handle(p->mb, (void *)b) ||
      p_dnnl_memory_set_data_handle(p->mc, c)) {
    snprintf(why, (size_t)whylen, "oneDNN refused a bf16 GEMM's buffers");
    return -1;
  }
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->ma}, {DNNL_ARG_WEIGHTS, p->mb}, {DNNL_ARG_DST, p->mc}};
  if (p_dnnl_primitive_execute(p->prim, stream, 3, args) || p_dnnl_stream_wait(stream)) {
    snprintf(why, (size_t)whylen, "oneDNN's matmul failed on a bf16 GEMM of %lld x %lld x %lld", (long long)m,
             (long long)n, (long long)k);
    return -1;
  }
  return 1;
}
#endif

int gemm16_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc, Gemm16Sgemm fallback,
                int nthreads, char *why, int whylen) {
  if (m <= 0 || n <= 0) return 0;
  if (k <= 0) { /* no products: C = beta C */
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta != 0 ? beta * c[i * ldc + j] : 0;
    return 0;
  }
#ifdef HPDL_HAVE_DNNL
  pthread_mutex_lock(&lock);
  int rc = gemm_dnnl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nthreads, why, whylen);
  pthread_mutex_unlock(&lock);
  if (rc) return rc < 0 ? -1 : 0;
#else
  (void)nthreads;
#endif
  return gemm_widened(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, fallback, why, whylen);
}

void gemm16_release(void) {
#ifdef HPDL_HAVE_DNNL
  pthread_mutex_lock(&lock);
  if (dnnl_state > 0) {
    for (int i = 0; i < nprims; i++) {
      p_dnnl_primitive_destroy(prims[i].prim);
      p_dnnl_memory_destroy(prims[i].ma);
      p_dnnl_memory_destroy(prims[i].mb);
      p_dnnl_memory_destroy(prims[i].mc);
    }
    nprims = 0;
    p_dnnl_stream_destroy(stream);
    p_dnnl_engine_destroy(engine);
    dnnl_state = 0; /* opened again (the library stays loaded) on the next product */
  }
  pthread_mutex_unlock(&lock);
#endif
}

const char *gemm16_backend(void) {
#ifdef HPDL_HAVE_DNNL
  pthread_mutex_lock(&lock);
  if (!dnnl_state) dnnl_open();
  pthread_mutex_unlock(&lock);
#endif
  return backend;
}
