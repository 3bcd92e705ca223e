/* common.h - what the host programs of tests/cuda_emu share: inputs from a fixed
 * seed, error statistics, the verdict. The kernels' own files never include it. */
#ifndef HPDL_CUDA_EMU_TEST_COMMON_H
#define HPDL_CUDA_EMU_TEST_COMMON_H
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

static int g_failures = 0;

#include "rng.h" /* Rng */

/* Max errors of got against ref; rel = |got - ref| / max(|ref|, floor). */
struct Err {
  double abs = 0, rel = 0;
  size_t count = 0, bad = 0;
  void add(double got, double ref, double floor_ = 1e-30) {
    double a = std::fabs(got - ref), r = a / std::fmax(std::fabs(ref), floor_);
    if (!(a == a) || std::isinf(got) != std::isinf(ref)) a = r = INFINITY;  // NaN or inf: worst
    if (got == ref) a = r = 0;
    if (a > abs) abs = a;
    if (r > rel) rel = r;
    count++;
  }
};

/* Prints one comparison and counts a failure when rel exceeds tol (or NaN). */
static inline bool verdict(const char* what, const Err& e, double tol) {
  bool ok = e.rel <= tol;
  std::printf("%-58s %7zu values  max abs err %.3g  max rel err %.3g  (tol %.3g)  %s\n", what, e.count, e.abs,
              e.rel, tol, ok ? "ok" : "FAIL");
  if (!ok) g_failures++;
  return ok;
}

static inline bool check(bool cond, const char* what) {
  std::printf("%-58s %s\n", what, cond ? "ok" : "FAIL");
  if (!cond) g_failures++;
  return cond;
}

static inline int finish(const char* name) {
  std::printf("%s: %s\n", name, g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
#endif
