/* test_rt_emustream.c - the emulated device's streams held late
 * (runtime/device/emustream.h, HPDL_EMU_STREAMS): under side-late a second
 * stream's work runs only when something waits for it (a wait, a sync, a
 * release), in the order given, and a copy to the host does not wait; under
 * launch-late the launch stream's copies, fills and GEMMs wait for a copy to
 * or from the host, a second stream's wait on it or a sync; held work that
 * fails is said by the op that ran it; a pointer that is no stream of the
 * device's is never held on; a mode it does not know is refused. The
 * device's memory is host memory, so the test reads it directly to see what
 * has run. */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "emustream.h"
#include "test_util.h"

static char trace[64]; /* the held work's letters, in the order it ran */

typedef struct {
  char letter;
  int fail;
} Piece;

static int run_piece(void *arg, char *msg, size_t len) {
  Piece *p = arg;
  size_t at = strlen(trace);
  if (at + 1 < sizeof trace) trace[at] = p->letter, trace[at + 1] = '\0';
  if (p->fail) return snprintf(msg, len, "piece %c failed", p->letter), -1;
  return 0;
}

static int defer(void *stream, char letter, int fail) {
  Piece *p = malloc(sizeof *p);
  *p = (Piece){letter, fail};
  int held = hpdl_emu_defer(stream, run_piece, p);
  if (!held) { /* as the NCCL double does: run at once */
    char msg[100];
    run_piece(p, msg, sizeof msg);
    free(p);
  }
  return held;
}

static Device *open_with(const char *mode) {
  setenv("HPDL_EMU_STREAMS", mode, 1);
  char err[300] = "";
  Device *d = dev_emu_open(err, sizeof err);
  if (!d) fprintf(stderr, "dev_emu_open(%s): %s\n", mode, err);
  return d;
}

static void test_unknown_mode(void) {
  setenv("HPDL_EMU_STREAMS", "sometimes", 1);
  char err[300] = "";
  EXPECT(dev_emu_open(err, sizeof err) == NULL);
  EXPECT_STR(err, "HPDL_EMU_STREAMS=sometimes: the emulated device's streams run 'order' (the default), 'side-late' or 'launch-late'");
}

static void test_order(void) {
  Device *d = open_with("order");
  if (!d) {
    test_failures++;
    return;
  }
  void *s = d->ops->stream_create(d);
  EXPECT(!defer(s, 'a', 0)); /* nothing is held: the caller runs it */
  EXPECT(!defer(NULL, 'a', 0));
  EXPECT(strstr(d->what, "streams") == NULL);
  d->ops->stream_destroy(d, s);
  d->ops->close(d);
}

static void test_side_late(void) {
  Device *d = open_with("side-late");
  if (!d) {
    test_failures++;
    return;
  }
  EXPECT(strstr(d->what, ", streams side-late") != NULL);
  void *s = d->ops->stream_create(d), *t = d->ops->stream_create(d);
  float *buf = d->ops->alloc(d, 4 * sizeof(float)), host[4] = {0};
  trace[0] = '\0';
  EXPECT(defer(s, 'a', 0) && defer(t, 'x', 0) && defer(s, 'b', 0));
  EXPECT(!defer(NULL, 'n', 0));          /* the launch stream runs at once */
  EXPECT(!defer((void *)&host, 'q', 0)); /* no stream of the device's */
  EXPECT_STR(trace, "nq");
  trace[0] = '\0';
  EXPECT(d->ops->to_host(d, host, buf, sizeof host) == 0);
  EXPECT_STR(trace, ""); /* a copy to the host does not wait for a second stream */
  EXPECT(d->ops->stream_wait(d, t, NULL) == 0);
  EXPECT_STR(trace, ""); /* waiting for the launch stream runs nothing held */
  EXPECT(d->ops->stream_wait(d, NULL, s) == 0);
  EXPECT_STR(trace, "ab"); /* s's work, in order; t's still held */
  EXPECT(d->ops->sync(d) == 0);
  EXPECT_STR(trace, "abx");
  /* a failure is said by the op that runs it, once */
  EXPECT(defer(s, 'c', 1) && defer(s, 'd', 0));
  EXPECT(d->ops->stream_wait(d, NULL, s) == -1);
  EXPECT_STR(dev_error(d), "work held on a stream failed: piece c failed");
  EXPECT_STR(trace, "abxcd");
  EXPECT(d->ops->stream_wait(d, NULL, s) == 0);
  /* a release runs everything first (cuMemFree waits for the device) */
  EXPECT(defer(t, 'e', 0));
  d->ops->release(d, buf);
  EXPECT_STR(trace, "abxcde");
  /* a stream destroyed runs what it holds */
  EXPECT(defer(t, 'f', 0));
  d->ops->stream_destroy(d, t);
  EXPECT_STR(trace, "abxcdef");
  EXPECT(!defer(t, 'g', 0)); /* and is no stream after */
  EXPECT_STR(trace, "abxcdefg");
  d->ops->stream_destroy(d, s);
  d->ops->close(d);
}

static void test_launch_late(void) {
  Device *d = open_with("launch-late");
  if (!d) {
    test_failures++;
    return;
  }
  EXPECT(strstr(d->what, ", streams launch-late") != NULL);
  void *s = d->ops->stream_create(d);
  float src[4] = {1, 2, 3, 4}, out[4] = {0};
  float *a = d->ops->alloc(d, sizeof src), *b = d->ops->alloc(d, sizeof src);
  EXPECT(d->ops->to_device(d, a, src, sizeof src) == 0);
  EXPECT(a[2] == 3);
  /* a device copy and a fill wait */
  EXPECT(d->ops->copy(d, b, a, sizeof src) == 0);
  EXPECT(b[3] == 0);
  EXPECT(d->ops->to_host(d, out, b, sizeof out) == 0); /* after the launch stream's work */
  EXPECT(out[3] == 4 && b[3] == 4);
  EXPECT(d->ops->zero(d, b, sizeof src) == 0);
  EXPECT(b[0] == 1);
  trace[0] = '\0';
  EXPECT(!defer(s, 's', 0)); /* a second stream runs at once */
  EXPECT(defer(NULL, 'l', 0));
  EXPECT_STR(trace, "s");
  EXPECT(d->ops->stream_wait(d, s, NULL) == 0); /* s after the launches: they run */
  EXPECT(b[0] == 0);
  EXPECT_STR(trace, "sl");
  /* a GEMM waits: C = A B, 2 x 2 */
  float *m = d->ops->alloc(d, 12 * sizeof(float));
  float init[12] = {1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0};
  EXPECT(d->ops->to_device(d, m, init, sizeof init) == 0);
  DevGemm g = {.a = 0, .b = 1, .c = 2, .bias = -1, .aux = -1, .m = 2, .n = 2, .k = 2, .lda = 2, .ldb = 2, .ldc = 2, .alpha = 1,
               .batch = 1, .epilogue = DEV_EPI_NONE};
  DevGemmPlan *p = d->ops->gemm_plan(d, &g);
  void *io[3] = {m, m + 4, m + 8};
  EXPECT(p && d->ops->gemm(d, p, io) == 0);
  EXPECT(m[8] == 0);
  EXPECT(d->ops->sync(d) == 0);
  EXPECT(m[8] == 19 && m[9] == 22 && m[10] == 43 && m[11] == 50);
  d->ops->release(d, a);
  d->ops->release(d, b);
  d->ops->release(d, m);
  d->ops->stream_destroy(d, s);
  d->ops->close(d);
}

int main(void) {
  test_unknown_mode();
  test_order();
  test_side_late();
  test_launch_late();
  TEST_DONE();
}
