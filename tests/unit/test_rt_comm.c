/* test_rt_comm.c - the collective interface on one process: the rank
 * layout (tensor innermost, as Megatron-LM), the one-rank Comm, and
 * gradient compression: fp16, int8 with per-chunk scales, top-k, and the
 * error-feedback residual. (Collectives over MPI ranks: tests/runtime/
 * mpi_collectives.c, run by runtime.cmake under mpirun.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "half.h"
#include "test_util.h"

static void test_layout(void) {
  CommLayout l = {2, 2, 2, 1, 1, 0}; /* dp, tp, pp, cp, ep, ep_fold */
  EXPECT(comm_layout_size(&l) == 8);
  /* rank = tp_i + tp (cp_i + cp (dp_i + dp pp_i)) */
  CommCoords c = comm_coords_of(&l, 5);
  EXPECT(c.tp == 1 && c.cp == 0 && c.dp == 0 && c.pp == 1);
  c = comm_coords_of(&l, 2);
  EXPECT(c.tp == 0 && c.dp == 1 && c.pp == 0);
  CommLayout l2 = {3, 2, 2, 2, 1, 0};
  for (int r = 0; r < comm_layout_size(&l2); r++) {
    CommCoords k = comm_coords_of(&l2, r);
    EXPECT(comm_rank_of(&l2, k) == r);
    EXPECT(r == k.tp + 2 * (k.cp + 2 * (k.dp + 3 * k.pp)));
  }
  /* the tensor group of rank 6 (tp 0, cp 1, dp 1 in l2) is ranks 6, 7 */
  CommCoords k = comm_coords_of(&l2, 6);
  EXPECT(k.tp == 0 && k.cp == 1 && k.dp == 1 && k.pp == 0);
  k.tp = 1;
  EXPECT(comm_rank_of(&l2, k) == 7);
  Comm dummy;
  RtErr e;
  memset(&dummy, 0, sizeof dummy);
  EXPECT(comm_init_groups(&dummy, &l, 6, 8, &e) == 0);
  EXPECT(dummy.rank[COMM_TP] == 0 && dummy.rank[COMM_DP] == 1 && dummy.rank[COMM_PP] == 1 && dummy.size[COMM_DP] == 2);
  EXPECT(comm_init_groups(&dummy, &l, 0, 4, &e) < 0);
  EXPECT(strstr(e.msg, "needs 8 ranks, but there are 4") != NULL);
  /* parallel folding: dp 4 x tp 2, ep 4 = tp 2 x 2 data-parallel ranks; the
   * expert group of rank r (tp r % 2, dp r / 2) is ranks 0-3 or 4-7 in order
   * tp_i + 2 (dp_i mod 2), the expert-data-parallel group every 4th rank */
  CommLayout lf = {4, 2, 1, 1, 4, 1};
  for (int r = 0; r < 8; r++) {
    Comm f;
    memset(&f, 0, sizeof f);
    EXPECT(comm_init_groups(&f, &lf, r, 8, &e) == 0);
    EXPECT(f.size[COMM_EP] == 4 && f.rank[COMM_EP] == r % 4);
    EXPECT(f.size[COMM_EDP] == 2 && f.rank[COMM_EDP] == r / 4);
    for (int q = 0; q < 4; q++) EXPECT(comm_rank_of(&lf, comm_ep_member(&lf, f.coords, q)) == r - r % 4 + q);
    for (int q = 0; q < 2; q++) EXPECT(comm_rank_of(&lf, comm_edp_member(&lf, f.coords, q)) == r % 4 + 4 * q);
  }
  /* unfolded, the same ep over dp 4 alone: every tensor rank its own group */
  CommLayout lu = {4, 2, 1, 1, 2, 0};
  Comm u;
  memset(&u, 0, sizeof u);
  EXPECT(comm_init_groups(&u, &lu, 7, 8, &e) == 0); /* tp 1, dp 3 */
  EXPECT(u.rank[COMM_EP] == 1 && u.rank[COMM_EDP] == 1 && comm_rank_of(&lu, comm_ep_member(&lu, u.coords, 0)) == 5);
  CommLayout lb = {4, 2, 1, 1, 6, 1}; /* 6 / 2 = 3 does not divide dp 4 */
  EXPECT(comm_init_groups(&u, &lb, 0, 8, &e) < 0 && strstr(e.msg, "folded expert group") != NULL);
}

static void test_local(void) {
  RtErr e;
  Comm *c = comm_local_new(&e);
  EXPECT(c && c->world_size == 1 && c->size[COMM_TP] == 1);
  float x[3] = {1, 2, 3}, y[3];
  EXPECT(comm_all_reduce(c, COMM_DP, COMM_F32, COMM_SUM, x, 3, &e) == 0 && x[2] == 3);
  EXPECT(comm_all_gather(c, COMM_TP, COMM_F32, x, 3, y, &e) == 0 && y[1] == 2);
  EXPECT(comm_reduce_scatter(c, COMM_TP, COMM_F32, COMM_SUM, x, 3, y, &e) == 0 && y[0] == 1);
  EXPECT(comm_broadcast(c, COMM_WORLD, COMM_F32, x, 3, 0, &e) == 0);
  EXPECT(comm_send(c, COMM_PP, COMM_F32, x, 3, 0, 0, &e) < 0);
  EXPECT(strstr(e.msg, "no peer") != NULL);
  EXPECT(comm_barrier(c, COMM_WORLD, &e) == 0);
  comm_destroy(c);
}

/* ---- compression ---- */

static void test_fp16_int8(void) {
  RtErr e;
  CommCompressor z;
  comm_compressor_init(&z, COMM_COMPRESS_FP16, 0, 0);
  float x[4] = {1.0f, 0.1f, -65504.0f, 1e-8f};
  unsigned char pay[8];
  EXPECT(comm_compressed_bytes(&z, 4) == 8);
  EXPECT(comm_compress(&z, x, 4, pay, &e) == 0);
  float acc[4] = {0};
  comm_decompress_add(&z, pay, 4, acc);
  for (int i = 0; i < 4; i++) EXPECT(acc[i] == half_to_f32(half_from_f32(x[i])));
  comm_compressor_free(&z);

  /* int8: 300 values = a chunk of 256 and one of 44, each with its scale */
  comm_compressor_init(&z, COMM_COMPRESS_INT8, 0, 0);
  enum { N = 300 };
  float v[N], back[N] = {0};
  for (int i = 0; i < N; i++) v[i] = i < 256 ? (float)(i - 128) * 0.5f : (float)(i - 256) * 0.01f;
  int64_t nb = comm_compressed_bytes(&z, N);
  EXPECT(nb == N + 8);
  unsigned char *p = malloc((size_t)nb), *odd = malloc((size_t)nb + 1);
  EXPECT(comm_compress(&z, v, N, p, &e) == 0);
  /* at an odd address too: the payload need not be aligned */
  EXPECT(comm_compress(&z, v, N, odd + 1, &e) == 0 && !memcmp(p, odd + 1, (size_t)nb));
  free(odd);
  float s0, s1;
  memcpy(&s0, p, 4);
  memcpy(&s1, p + 4, 4);
  EXPECT(s0 == 64.0f / 127.0f && s1 == v[299] / 127.0f); /* max |x| / 127 per chunk */
  EXPECT((int8_t)p[8 + 0] == -127 && (int8_t)p[8 + 255] == (int8_t)nearbyintf(63.5f / s0));
  comm_decompress_add(&z, p, N, back);
  for (int i = 0; i < N; i++) EXPECT(fabsf(back[i] - v[i]) <= 0.5f * (i < 256 ? s0 : s1) * 1.0001f);
  free(p);
  comm_compressor_free(&z);
}

static int cmp_abs_desc(const void *a, const void *b) {
  float x = fabsf(*(const float *)a), y = fabsf(*(const float *)b);
  return (x < y) - (x > y);
}

static void test_topk(void) {
  RtErr e;
  enum { N = 1000 };
  CommCompressor z;
  comm_compressor_init(&z, COMM_COMPRESS_TOPK, 0.05, 0);
  EXPECT(comm_compressed_bytes(&z, N) == 8 * 50);
  float x[N], sorted[N], acc[N] = {0};
  for (int i = 0; i < N; i++) x[i] = (float)sin(i * 12.9898) * (float)(1 + (i % 7));
  memcpy(sorted, x, sizeof x);
  qsort(sorted, N, sizeof(float), cmp_abs_desc);
  unsigned char *p = malloc(8 * 50);
  EXPECT(comm_compress(&z, x, N, p, &e) == 0);
  comm_decompress_add(&z, p, N, acc);
  int kept = 0;
  for (int i = 0; i < N; i++)
    if (acc[i] != 0) {
      kept++;
      EXPECT(acc[i] == x[i]);                         /* sent exactly */
      EXPECT(fabsf(x[i]) >= fabsf(sorted[49]));       /* and among the 50 largest */
    }
  EXPECT(kept == 50);
  int32_t prev = -1;
  for (int j = 0; j < 50; j++) { /* indices ascending: a canonical payload */
    int32_t i;
    memcpy(&i, p + 8 * j, 4);
    EXPECT(i > prev);
    prev = i;
  }
  free(p);
  comm_compressor_free(&z);
}

/* Error feedback: residual' = (x + residual) - sent, exactly, so over many
 * steps the sum of what was sent plus the last residual is the sum of the
 * inputs (Karimireddy et al. 2019, EF-SGD). */
static void test_error_feedback(void) {
  RtErr e;
  enum { N = 64, STEPS = 30 };
  CommCompressKind kinds[4] = {COMM_COMPRESS_TOPK, COMM_COMPRESS_INT8, COMM_COMPRESS_FP16, COMM_COMPRESS_BF16};
  for (int k = 0; k < 4; k++) {
    CommCompressor z;
    comm_compressor_init(&z, kinds[k], 0.1, 1);
    double sum_in[N] = {0}, sum_sent[N] = {0};
    unsigned char *p = malloc((size_t)comm_compressed_bytes(&z, N));
    for (int t = 0; t < STEPS; t++) {
      float x[N], prev[N], sent[N] = {0};
      for (int i = 0; i < N; i++) x[i] = (float)(cos(0.37 * i + 1.3 * t) * 1e-3 * (1 + i));
      if (z.residual) memcpy(prev, z.residual, sizeof prev);
      else memset(prev, 0, sizeof prev);
      EXPECT(comm_compress(&z, x, N, p, &e) == 0);
      comm_decompress_add(&z, p, N, sent);
      for (int i = 0; i < N; i++) {
        float v = x[i] + prev[i];
        EXPECT(z.residual[i] == v - sent[i]); /* the residual is exactly what was not sent */
        sum_in[i] += x[i];
        sum_sent[i] += sent[i];
      }
    }
    for (int i = 0; i < N; i++) EXPECT(fabs(sum_sent[i] + z.residual[i] - sum_in[i]) < 1e-6);
    /* top-k: each value is sent sooner or later, so the residual stays bounded */
    if (kinds[k] == COMM_COMPRESS_TOPK)
      for (int i = 0; i < N; i++) EXPECT(fabsf(z.residual[i]) < 0.5f);
    free(p);
    comm_compressor_free(&z);
  }
  /* without error feedback nothing is kept */
  CommCompressor z;
  comm_compressor_init(&z, COMM_COMPRESS_TOPK, 0.1, 0);
  float x[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  unsigned char p[8];
  EXPECT(comm_compress(&z, x, 10, p, &e) == 0 && z.residual == NULL);
  comm_compressor_free(&z);
}

static void test_allreduce_compressed_local(void) {
  RtErr e;
  Comm *c = comm_local_new(&e);
  CommCompressor z;
  comm_compressor_init(&z, COMM_COMPRESS_FP16, 0, 1);
  float x[3] = {0.1f, 0.2f, 0.3f};
  EXPECT(comm_allreduce_compressed(c, COMM_DP, &z, x, 3, &e) == 0);
  EXPECT(x[0] == half_to_f32(half_from_f32(0.1f)));
  EXPECT(z.residual[0] == 0.1f - x[0]);
  comm_compressor_free(&z);
  EXPECT(comm_compress_parse("int8") == COMM_COMPRESS_INT8 && comm_compress_parse("zip") < 0);
  comm_destroy(c);
}

int main(void) {
  test_layout();
  test_local();
  test_fp16_int8();
  test_topk();
  test_error_feedback();
  test_allreduce_compressed_local();
  TEST_DONE();
}
