/* device.c - opening a device by name, and the reference GEMM the emulated
 * device runs (device.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "half.h"

Device *dev_open(const char *kind, int ordinal, char *err, size_t errlen) {
  if (!strcmp(kind, "cuda")) return dev_cuda_open(ordinal, err, errlen);
  if (!strcmp(kind, "emulate")) return dev_emu_open(err, errlen);
  snprintf(err, errlen, "unknown device '%s' (cuda or emulate)", kind);
  return NULL;
}

const char *dev_error(const Device *d) { return d->err; }

int dev_copy_bf16(Device *d, void *dev, float *host, int64_t n, int to_device) {
  uint16_t *h16 = malloc(2 * (size_t)(n > 0 ? n : 1));
  if (!h16) {
    snprintf(d->err, sizeof d->err, "out of memory");
    return -1;
  }
  if (to_device)
    for (int64_t j = 0; j < n; j++) h16[j] = half_bf16_from_f32(host[j]);
  int rc = to_device ? d->ops->to_device(d, dev, h16, 2 * (size_t)n) : d->ops->to_host(d, h16, dev, 2 * (size_t)n);
  if (!rc && !to_device)
    for (int64_t j = 0; j < n; j++) host[j] = half_bf16_to_f32(h16[j]);
  free(h16);
  return rc ? -1 : 0;
}

int dev_epilogue_of(const char *name) {
  static const char *const names[] = {"bias", "bias_relu", "bias_gelu", "bgrad_a", "bgrad_b"};
  static const DevEpilogue kinds[] = {DEV_EPI_BIAS, DEV_EPI_BIAS_RELU, DEV_EPI_BIAS_GELU, DEV_EPI_BGRAD_A, DEV_EPI_BGRAD_B};
  if (!name) return DEV_EPI_NONE;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i])) return (int)kinds[i];
  return -1;
}

/* The tanh form of GELU (kernels/hpdl_cuda.cuh, cuBLASLt's GELU epilogue). */
static float gelu(float x) {
  const float k = 0.79788456080286535588f, c = 0.044715f;
  return 0.5f * x * (1.0f + tanhf(k * (x + c * x * x * x)));
}

/* Element i of a GEMM operand: fp32, or (bf16) a bf16's bits. */
static float operand(const void *p, int64_t i, int bf16) {
  return bf16 ? half_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

void dev_gemm_reference(const DevGemm *g, void *const *io) {
  int64_t nbatch = 1;
  for (int i = 0; i < g->batch_axes; i++) nbatch *= g->bdims[i];
  const void *A = io[g->a], *B = io[g->b];
  /* a bf16 D: the product and the bias in fp32 here, rounded into D at the end */
  float *C = g->c_bf16 ? malloc(sizeof(float) * (size_t)(nbatch * g->m * g->n + 1)) : io[g->c];
  if (!C) abort(); /* the emulated device's reference, tests only */
  for (int64_t bi = 0; bi < nbatch; bi++) {
    int64_t oa = 0, ob = 0, inner = 1;
    for (int i = g->batch_axes - 1; i >= 0; i--) {
      int64_t idx = (bi / inner) % g->bdims[i];
      oa += idx * g->sa[i];
      ob += idx * g->sb[i];
      inner *= g->bdims[i];
    }
    int64_t a0 = oa * g->amat, b0 = ob * g->bmat;
    float *c = C + bi * g->m * g->n;
    for (int64_t i = 0; i < g->m; i++)
      for (int64_t j = 0; j < g->n; j++) {
        float s = 0.0f;
        for (int64_t q = 0; q < g->k; q++) {
          float x = operand(A, a0 + (g->trans_a ? q * g->lda + i : i * g->lda + q), g->ab_bf16);
          float y = operand(B, b0 + (g->trans_b ? j * g->ldb + q : q * g->ldb + j), g->ab_bf16);
          s += x * y;
        }
        c[i * g->n + j] = (float)g->alpha * s;
      }
  }
  int64_t rows = nbatch * g->m;
  if (g->epilogue == DEV_EPI_BGRAD_A || g->epilogue == DEV_EPI_BGRAD_B) {
    /* the operand's stored [k, x] rows summed in order of k, fp32 (cuBLASLt's BGRADB / BGRADA) */
    int side_a = g->epilogue == DEV_EPI_BGRAD_A;
    const void *X = side_a ? A : B;
    int64_t x = side_a ? g->m : g->n, ld = side_a ? g->lda : g->ldb;
    float *out = io[g->bias];
    for (int64_t j = 0; j < x; j++) {
      float s = 0.0f;
      for (int64_t q = 0; q < g->k; q++) s += operand(X, q * ld + j, g->ab_bf16);
      out[j] = s;
    }
    return;
  }
  if (g->epilogue != DEV_EPI_NONE) {
    const float *bias = io[g->bias];
    float *aux = g->aux >= 0 ? io[g->aux] : NULL;
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < g->n; j++) {
        float v = C[i * g->n + j] + bias[j];
        if (aux) aux[i * g->n + j] = v;
        C[i * g->n + j] = g->epilogue == DEV_EPI_BIAS_RELU ? (v > 0.0f ? v : 0.0f) : g->epilogue == DEV_EPI_BIAS_GELU ? gelu(v) : v;
      }
  }
  if (g->c_bf16) { /* the bare product, or the bias's sum, rounded into D */
    uint16_t *D = io[g->c];
    for (int64_t i = 0; i < rows * g->n; i++) D[i] = half_bf16_from_f32(C[i]);
    free(C);
  }
}
