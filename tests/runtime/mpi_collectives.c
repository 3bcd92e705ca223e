/* mpi_collectives.c - the MPI Comm under mpirun: every group of a
 * dp x tp x pp x cp layout has the members the rank formula says, in
 * order, and each collective gives the values worked out here from the
 * ranks' inputs; the compressed data-parallel reduction equals the sum of
 * every member's compressed values in rank order, bit for bit, and so does
 * each member's slice of the compressed reduce-scatter; with
 * expert parallelism EP (dividing DP) the ep and edp groups too, and
 * all_to_all in every group.
 *   mpirun -np N mpi_collectives DP TP PP CP [EP] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

static int failures;

#define CHECK(cond)                                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", me, __FILE__, __LINE__, #cond);      \
      failures++;                                                                                \
    }                                                                                            \
  } while (0)

static int me;

/* The world rank of member m of group g as seen from coordinates k. */
static int member(const CommLayout *l, CommCoords k, CommGroup g, int m) {
  switch (g) {
  case COMM_DP: k.dp = m; break;
  case COMM_TP: k.tp = m; break;
  case COMM_PP: k.pp = m; break;
  case COMM_CP: k.cp = m; break;
  case COMM_EP: k.dp = k.dp / l->ep * l->ep + m; break; /* ep consecutive dp members */
  case COMM_EDP: k.dp = k.dp % l->ep + l->ep * m; break; /* the same place in each block */
  default: return m;
  }
  return comm_rank_of(l, k);
}

static float input_of(int rank, int i) { return (float)(sin(0.7 * rank + 0.13 * i) * (1 + i % 5)); }

int main(int argc, char **argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: mpi_collectives DP TP PP CP [EP]\n");
    return 2;
  }
  CommLayout l = {atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), argc >= 6 ? atoi(argv[5]) : 1, argc >= 7 ? atoi(argv[6]) : 0};
  RtErr e;
  Comm *c = comm_mpi_new(&l, &e);
  if (!c) {
    fprintf(stderr, "comm_mpi_new: %s\n", e.msg);
    return 1;
  }
  me = c->world_rank;
  CommCoords k = comm_coords_of(&l, me);
  /* membership and order: all_gather of the world ranks */
  for (int g = 0; g < COMM_NGROUPS; g++) {
    int n = c->size[g];
    int32_t mine = me, *all = calloc((size_t)n, sizeof *all);
    CHECK(comm_all_gather(c, (CommGroup)g, COMM_I32, &mine, 1, all, &e) == 0);
    for (int m = 0; m < n; m++) CHECK(all[m] == member(&l, k, (CommGroup)g, m));
    CHECK(all[c->rank[g]] == me);
    free(all);
    /* sum and max of the members' world ranks */
    double s = me, mx = me, want_s = 0, want_mx = 0;
    for (int m = 0; m < n; m++) {
      want_s += member(&l, k, (CommGroup)g, m);
      if (member(&l, k, (CommGroup)g, m) > want_mx) want_mx = member(&l, k, (CommGroup)g, m);
    }
    CHECK(comm_all_reduce(c, (CommGroup)g, COMM_F64, COMM_SUM, &s, 1, &e) == 0 && s == want_s);
    CHECK(comm_all_reduce(c, (CommGroup)g, COMM_F64, COMM_MAX, &mx, 1, &e) == 0 && mx == want_mx);
    /* reduce_scatter: member m's piece i is the sum of everyone's in[m*3 + i] */
    float in[64], out[3];
    for (int m = 0; m < n; m++)
      for (int i = 0; i < 3; i++) in[m * 3 + i] = (float)(me * 100 + m * 10 + i);
    CHECK(comm_reduce_scatter(c, (CommGroup)g, COMM_F32, COMM_SUM, in, 3, out, &e) == 0);
    for (int i = 0; i < 3; i++) {
      float want = 0;
      for (int m = 0; m < n; m++) want += (float)(member(&l, k, (CommGroup)g, m) * 100 + c->rank[g] * 10 + i);
      CHECK(out[i] == want);
    }
    /* all_to_all: member m gets from each member q its values [m * 2, m * 2 + 2) */
    double a2a_in[128], a2a_out[128];
    for (int m = 0; m < n; m++)
      for (int i = 0; i < 2; i++) a2a_in[m * 2 + i] = me * 1000 + m * 10 + i;
    CHECK(comm_all_to_all(c, (CommGroup)g, COMM_F64, a2a_in, 2, a2a_out, &e) == 0);
    for (int q = 0; q < n; q++)
      for (int i = 0; i < 2; i++) CHECK(a2a_out[q * 2 + i] == member(&l, k, (CommGroup)g, q) * 1000 + c->rank[g] * 10 + i);
    /* broadcast from the last member */
    double b[2] = {me, -me};
    CHECK(comm_broadcast(c, (CommGroup)g, COMM_F64, b, 2, n - 1, &e) == 0);
    CHECK(b[0] == member(&l, k, (CommGroup)g, n - 1) && b[1] == -b[0]);
  }
  /* pipeline send / recv: each stage passes a message to the next */
  if (c->size[COMM_PP] > 1) {
    int s = c->rank[COMM_PP], n = c->size[COMM_PP];
    float msg[5], got[5];
    for (int i = 0; i < 5; i++) msg[i] = (float)(me * 10 + i);
    if (s % 2 == 0) {
      if (s + 1 < n) CHECK(comm_send(c, COMM_PP, COMM_F32, msg, 5, s + 1, 7, &e) == 0);
      if (s > 0) CHECK(comm_recv(c, COMM_PP, COMM_F32, got, 5, s - 1, 7, &e) == 0 && got[4] == (float)(member(&l, k, COMM_PP, s - 1) * 10 + 4));
    } else {
      CHECK(comm_recv(c, COMM_PP, COMM_F32, got, 5, s - 1, 7, &e) == 0 && got[0] == (float)(member(&l, k, COMM_PP, s - 1) * 10));
      if (s + 1 < n) CHECK(comm_send(c, COMM_PP, COMM_F32, msg, 5, s + 1, 7, &e) == 0);
    }
    CHECK(comm_send(c, COMM_PP, COMM_F32, msg, 5, n, 7, &e) < 0); /* no such member */
  }
  /* compressed data-parallel reduction, each kind (N not a multiple of dp: at dp 4 fp16 and
   * bf16 go as a padded reduce-scatter and all-gather, COMM_COMPRESS_RS_FROM) */
  enum { N = 1003 };
  for (int kind = COMM_COMPRESS_FP16; kind <= COMM_COMPRESS_BF16; kind++) {
    CommCompressor z;
    comm_compressor_init(&z, (CommCompressKind)kind, 0.05, 1);
    float x[N], want[N] = {0};
    for (int i = 0; i < N; i++) x[i] = input_of(me, i);
    for (int m = 0; m < c->size[COMM_DP]; m++) {
      CommCompressor zm;
      comm_compressor_init(&zm, (CommCompressKind)kind, 0.05, 0);
      float xm[N];
      unsigned char *p = malloc((size_t)comm_compressed_bytes(&zm, N));
      for (int i = 0; i < N; i++) xm[i] = input_of(member(&l, k, COMM_DP, m), i);
      CHECK(comm_compress(&zm, xm, N, p, &e) == 0);
      comm_decompress_add(&zm, p, N, want);
      free(p);
      comm_compressor_free(&zm);
    }
    CHECK(comm_allreduce_compressed(c, COMM_DP, &z, x, N, &e) == 0);
    CHECK(!memcmp(x, want, sizeof x));
    /* and every member holds the same bits */
    float mx[N];
    memcpy(mx, x, sizeof x);
    CHECK(comm_all_reduce(c, COMM_DP, COMM_F32, COMM_MAX, mx, N, &e) == 0 && !memcmp(mx, x, sizeof x));
    comm_compressor_free(&z);
  }
  /* the compressed reduce-scatter (ZeRO 2, 3): this member's slice of S values is
   * the sum in rank order of every member's compressed slice, compressed on its own;
   * under fp16 and bf16 the compressed all-reduce's values of that slice */
  enum { S = 300 };
  for (int kind = COMM_COMPRESS_FP16; kind <= COMM_COMPRESS_BF16; kind++) {
    int dp = c->size[COMM_DP], mine = c->rank[COMM_DP];
    CommCompressor z, za;
    comm_compressor_init(&z, (CommCompressKind)kind, 0.05, 1);
    comm_compressor_init(&za, (CommCompressKind)kind, 0.05, 0);
    float *x = malloc(sizeof(float) * S * (size_t)dp), *all = malloc(sizeof(float) * S * (size_t)dp), out[S], want[S] = {0};
    for (int i = 0; i < S * dp; i++) x[i] = all[i] = input_of(me, i);
    for (int m = 0; m < dp; m++) {
      CommCompressor zm;
      comm_compressor_init(&zm, (CommCompressKind)kind, 0.05, 0);
      float xm[S];
      unsigned char *p = malloc((size_t)comm_compressed_bytes(&zm, S));
      for (int i = 0; i < S; i++) xm[i] = input_of(member(&l, k, COMM_DP, m), mine * S + i);
      CHECK(comm_compress(&zm, xm, S, p, &e) == 0);
      comm_decompress_add(&zm, p, S, want);
      free(p);
      comm_compressor_free(&zm);
    }
    CHECK(comm_reduce_scatter_compressed(c, COMM_DP, &z, x, S, out, &e) == 0);
    CHECK(!memcmp(out, want, sizeof out));
    if (kind == COMM_COMPRESS_FP16 || kind == COMM_COMPRESS_BF16) {
      CHECK(comm_allreduce_compressed(c, COMM_DP, &za, all, S * dp, &e) == 0);
      CHECK(!memcmp(out, all + (size_t)mine * S, sizeof out));
    }
    /* error feedback: the residual of every value kept for the next step */
    CHECK(z.n == (int64_t)S * dp || kind == COMM_COMPRESS_NONE);
    free(x);
    free(all);
    comm_compressor_free(&z);
    comm_compressor_free(&za);
  }
  double f = failures;
  comm_all_reduce(c, COMM_WORLD, COMM_F64, COMM_SUM, &f, 1, &e);
  if (me == 0)
    printf("%s: %d ranks, dp=%d tp=%d pp=%d cp=%d ep=%d, %g failure(s)\n", f ? "FAILED" : "ok", c->world_size, l.dp, l.tp, l.pp, l.cp,
           l.ep, f);
  comm_destroy(c);
  return f ? 1 : 0;
}
