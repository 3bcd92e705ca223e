/* test_util.h - a minimal assertion kit for the C unit tests. */
#ifndef HPDL_TEST_UTIL_H
#define HPDL_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int test_failures;

#define EXPECT(cond)                                                              \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond); \
      test_failures++;                                                            \
    }                                                                             \
  } while (0)

#define EXPECT_STR(got, want)                                                        \
  do {                                                                               \
    const char *g_ = (got), *w_ = (want);                                            \
    if (!g_ || strcmp(g_, w_) != 0) {                                                \
      fprintf(stderr, "%s:%d: got \"%s\", want \"%s\"\n", __FILE__, __LINE__,        \
              g_ ? g_ : "(null)", w_);                                               \
      test_failures++;                                                               \
    }                                                                                \
  } while (0)

#define EXPECT_NEAR(got, want, rel)                                                  \
  do {                                                                               \
    double g_ = (got), w_ = (want);                                                  \
    if (!(fabs(g_ - w_) <= (rel) * fabs(w_) + 1e-300)) {                             \
      fprintf(stderr, "%s:%d: got %.17g, want %.17g (rel tol %g)\n", __FILE__,       \
              __LINE__, g_, w_, (double)(rel));                                      \
      test_failures++;                                                               \
    }                                                                                \
  } while (0)

#define TEST_DONE()                                                                  \
  do {                                                                               \
    if (test_failures) fprintf(stderr, "%d expectation(s) failed\n", test_failures); \
    return test_failures ? 1 : 0;                                                    \
  } while (0)

#endif
