/* testops.c - native functions for the extern tests (tests/extern.cmake):
 * the calling convention of docs/language.md ("Extern"), f32 buffers and the
 * dimension names' values as int64_t after them.
 *
 *   bias_gelu(x: f32[B, T, F], b: f32[F]) -> f32[B, T, F]:  gelu(x + b), the tanh form
 *   and its gradient; the model with builtins computes the same thing as
 *   gelu(x + b), so the two must agree. */
#include <math.h>
#include <stdint.h>

static const double K = 0.79788456080286535588; /* sqrt(2 / pi) */
static const double C3 = 0.044715;

void bias_gelu_f32(const float *x, const float *b, float *out, int64_t B, int64_t T, int64_t F) {
  for (int64_t r = 0; r < B * T; r++)
    for (int64_t f = 0; f < F; f++) {
      double v = (double)x[r * F + f] + (double)b[f];
      out[r * F + f] = (float)(0.5 * v * (1.0 + tanh(K * (v + C3 * v * v * v))));
    }
}

/* dx = gelu'(x + b) dout; db = the sum of dx over the rows. dx and db arrive zeroed. */
void bias_gelu_grad_f32(const float *x, const float *b, const float *dout, float *dx, float *db, int64_t B, int64_t T,
                        int64_t F) {
  for (int64_t r = 0; r < B * T; r++)
    for (int64_t f = 0; f < F; f++) {
      double v = (double)x[r * F + f] + (double)b[f];
      double u = K * (v + C3 * v * v * v), t = tanh(u);
      double d = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * K * (1.0 + 3.0 * C3 * v * v);
      double g = d * (double)dout[r * F + f];
      dx[r * F + f] = (float)g;
      db[f] += (float)g;
    }
}
