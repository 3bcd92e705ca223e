/* half.h - 16-bit floats: IEEE binary16 (fp16) and bfloat16, to and from
 * fp32 with round-to-nearest-even (as CUDA's __float2half_rn and
 * __float2bfloat16_rn), so that values converted here and on a GPU agree
 * bit for bit. Used by the reference executor (16-bit storage under mixed
 * precision), checkpoints (F16 / BF16 tensors) and fp16 gradient
 * compression. */
#ifndef HPDL_HALF_H
#define HPDL_HALF_H

#include <stdint.h>

uint16_t half_from_f32(float f);   /* fp16; overflow gives infinity */
float half_to_f32(uint16_t h);
uint16_t half_bf16_from_f32(float f);
float half_bf16_to_f32(uint16_t h);

/* half_bf16_from_f32 of the float with bits x, inline and branch-free so
 * that a loop over many values vectorises (the weights' bf16 copies). */
static inline uint16_t half_bf16_bits(uint32_t x) {
  uint32_t nan = (x & 0x7fffffffu) > 0x7f800000u;
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (uint16_t)(nan ? (x >> 16) | 0x40u : rounded);
}

#endif
