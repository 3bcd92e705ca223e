/* half.c - fp16 and bf16 conversions by bit manipulation. */
#include "half.h"

#include <string.h>

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t half_from_f32(float f) {
  uint32_t x = bits_of(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t exp = (x >> 23) & 0xff, man = x & 0x7fffff;
  if (exp == 0xff) /* infinity, or NaN kept quiet and non-zero */
    return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
  int32_t e = (int32_t)exp - 127 + 15;
  if (e >= 0x1f) return (uint16_t)(sign | 0x7c00);
  if (e <= 0) {
    /* A subnormal half (or zero): shift the significand with its implicit
     * bit into place, rounding to nearest even on the bits shifted out. */
    if (e < -10) return sign;
    uint32_t m = man | 0x800000;
    int shift = 14 - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
  /* A carry out of the significand bumps the exponent, which is right (up to
   * infinity). */
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return (uint16_t)(sign | r);
}

float half_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return float_of(sign | 0x7f800000 | (man << 13));
  if (exp == 0) {
    if (!man) return float_of(sign);
    /* subnormal: normalise */
    int e = -1;
    do {
      e++;
      man <<= 1;
    } while (!(man & 0x400));
    return float_of(sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13));
  }
  return float_of(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

/* (bf16's conversions are inline in half.h) */
