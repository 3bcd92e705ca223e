/* test_comm_nccl.c - the NCCL Comm's order of calls (runtime/comm_nccl.c),
 * on four MPI ranks (dp 2 x pp 2) through tests/cuda/fake_nccl.c, which
 * journals every call with its stream (fake_nccl_log): HPDL_NCCL must name
 * it.
 *
 *   mpirun -np 4 test_comm_nccl
 *
 * Checks, with the pipeline group's transfers on a stream of their own
 * (comm_nccl_set_group_stream) and host memory standing for the device's:
 *   - a held send (isend) posts nothing;
 *   - a receive of the same group posts it with the receive in one group
 *     call, both on the pipeline's stream, after that stream waited for the
 *     launch stream, and the launch stream waits for it after;
 *   - a transfer of another group (the data-parallel one, on the launch
 *     stream) does not post a held pipeline send; wait_sends does, with no
 *     wait after; the world has no communicator;
 *   - the values arrive; an all-reduce runs on the stream set for it
 *     (comm_nccl_set_stream).
 * Exit 77 (CTest's skip) where the fake library is not given. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

static char waits[1024]; /* the stream_wait calls: "W(waiter<-waited)" */
static int failures;

static int wait_cb(void *ctx, void *waiter, void *waited) {
  (void)ctx;
  size_t at = strlen(waits);
  snprintf(waits + at, sizeof waits - at, "%sW(%lx<-%lx)", at ? " " : "", (unsigned long)(size_t)waiter, (unsigned long)(size_t)waited);
  return 0;
}

static int copy_cb(void *ctx, void *dst, const void *src, size_t n) {
  (void)ctx;
  memmove(dst, src, n);
  return 0;
}

static void expect_text(int me, const char *what, const char *got, const char *want) {
  if (strcmp(got, want)) {
    fprintf(stderr, "rank %d: %s:\n  got  \"%s\"\n  want \"%s\"\n", me, what, got, want);
    failures++;
  }
}

int main(void) {
  const char *lib = getenv("HPDL_NCCL");
  if (!lib || !strstr(lib, "fake")) {
    printf("skipped: HPDL_NCCL does not name tests/cuda/fake_nccl.c's library\n");
    return 77;
  }
  RtErr e = {{0}};
  CommLayout l = {2, 1, 2, 1, 1, 0};
  Comm *host = comm_mpi_new(&l, &e);
  if (!host) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  /* me: this rank's stage; peers: the other stage, and the other data-parallel member */
  int me = host->rank[COMM_PP], peer = 1 - me, dme = host->rank[COMM_DP], dpeer = 1 - dme;
  const char *(*journal)(void) = NULL;
  void *h = NULL;
  CommDevCopy dc = {NULL, copy_cb, wait_cb};
  Comm *n = comm_nccl_new(host, &dc, &e);
  if (!n || !(h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD)) || !(journal = (const char *(*)(void))dlsym(h, "fake_nccl_log"))) {
    fprintf(stderr, "rank %d: %s\n", me, n ? "the fake library has no fake_nccl_log" : e.msg);
    comm_mpi_finalize();
    return 1;
  }
  journal(); /* the set-up's calls */
  void *pstream = (void *)0x50;
  comm_nccl_set_group_stream(n, COMM_PP, pstream);
  float out[4] = {10.0f * me, 10.0f * me + 1, 10.0f * me + 2, 10.0f * me + 3}, in[4] = {0}, w[2] = {0}, wo[2] = {(float)me, 7};
  /* a held send posts nothing */
  if (comm_isend(n, COMM_PP, COMM_F32, out, 4, peer, 0, &e)) failures++;
  expect_text(me, "isend", journal(), "");
  /* another group's transfer leaves it held: dp member 0 sends, 1 receives */
  waits[0] = '\0';
  wo[0] = (float)dme;
  if (dme == 0 ? comm_send(n, COMM_DP, COMM_F32, wo, 2, dpeer, 0, &e) : comm_recv(n, COMM_DP, COMM_F32, w, 2, dpeer, 0, &e)) failures++;
  expect_text(me, "a data-parallel transfer with a pipeline send held", journal(), dme == 0 ? "start@0 send@0 end@0" : "start@0 recv@0 end@0");
  expect_text(me, "its stream waits", waits, "");
  /* the pipeline's receive posts the held send with it */
  waits[0] = '\0';
  if (comm_recv(n, COMM_PP, COMM_F32, in, 4, peer, 0, &e)) failures++;
  expect_text(me, "a pipeline receive", journal(), "start@0 send@50 recv@50 end@0");
  expect_text(me, "its stream waits", waits, "W(50<-0) W(0<-50)");
  for (int i = 0; i < 4; i++)
    if (in[i] != 10.0f * peer + (float)i) failures++, fprintf(stderr, "rank %d: value %d is %g\n", me, i, in[i]);
  if (dme == 1 && (w[0] != 0.0f || w[1] != 7.0f)) failures++, fprintf(stderr, "dp member 1: the message is %g %g\n", w[0], w[1]);
  if (comm_all_reduce(n, COMM_WORLD, COMM_F32, COMM_SUM, w, 2, &e) == 0) failures++, fprintf(stderr, "rank %d: a world all-reduce ran\n", me);
  /* wait_sends posts what is held, with no wait after */
  waits[0] = '\0';
  if (comm_isend(n, COMM_PP, COMM_F32, out, 4, peer, 0, &e)) failures++;
  if (me == 0 ? comm_wait_sends(n, &e) : comm_recv(n, COMM_PP, COMM_F32, in, 4, peer, 0, &e)) failures++;
  if (me == 1 && comm_wait_sends(n, &e)) failures++;
  expect_text(me, "wait_sends", journal(), me == 0 ? "start@0 send@50 end@0" : "start@0 send@50 recv@50 end@0");
  expect_text(me, "its stream waits", waits, me == 0 ? "W(50<-0)" : "W(50<-0) W(0<-50)");
  if (me == 0 && (comm_recv(n, COMM_PP, COMM_F32, in, 4, peer, 0, &e))) failures++;
  if (me == 1 && comm_wait_sends(n, &e)) failures++;
  journal();
  /* a reduction on the stream set for it */
  comm_nccl_set_stream(n, (void *)0x70);
  float s[2] = {1.0f + (float)me, 2};
  if (comm_all_reduce(n, COMM_PP, COMM_F32, COMM_SUM, s, 2, &e)) failures++;
  comm_nccl_set_stream(n, NULL);
  expect_text(me, "an all-reduce", journal(), "allreduce@70");
  if (s[0] != 3.0f || s[1] != 4.0f) failures++, fprintf(stderr, "rank %d: the sum is %g %g\n", me, s[0], s[1]);
  if (comm_nccl_sync_group(n, COMM_PP, &e)) failures++;
  int all = failures, first = host->world_rank == 0;
  comm_all_reduce(host, COMM_WORLD, COMM_I32, COMM_SUM, &all, 1, &e);
  comm_destroy(n);
  comm_destroy(host);
  if (first) printf("%s: %d failures over 4 ranks\n", all ? "FAILED" : "ok", all);
  return all ? 1 : 0;
}
