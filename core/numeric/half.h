/* half.h - 16-bit floats: IEEE binary16 (fp16) and bfloat16, to and from
 * fp32 with round-to-nearest-even (as CUDA's __float2half_rn and
 * __float2bfloat16_rn), so that values converted here and on a GPU agree
 * bit for bit. Used by the reference executor (16-bit storage under mixed
 * precision), checkpoints (F16 / BF16 tensors) and fp16 gradient
 * compression. */
#ifndef HPDL_HALF_H
#define HPDL_HALF_H

#include <stdint.h>
#include <string.h>

uint16_t half_from_f32(float f);   /* fp16; overflow gives infinity */
float half_to_f32(uint16_t h);

/* bf16 of the float with bits x, inline and branch-free so that a loop over
 * many values vectorises (the weights' bf16 copies, the optimizer's bf16
 * moments). */
static inline uint16_t half_bf16_bits(uint32_t x) {
  uint32_t nan = (x & 0x7fffffffu) > 0x7f800000u;
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (uint16_t)(nan ? (x >> 16) | 0x40u : rounded);
}

/* bf16 to and from fp32, inline for the same reason: widening is exact,
 * narrowing rounds to nearest even, a NaN kept quiet. */
static inline uint16_t half_bf16_from_f32(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return half_bf16_bits(x);
}

static inline float half_bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

#endif
